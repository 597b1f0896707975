"""The one place a cache is built from the settings (the CTXBUILD_* variables the driver sets from flags and
`cache:` in _defaults.yaml), and the remote backends by URL scheme.

Adding a backend: a module implementing store.Remote, and its line in BACKENDS.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from ctxbuild import settings
from ctxbuild.errors import CtxbuildError, UsageError
from ctxbuild.layout import cache_dir
from ctxbuild.cache.files import LINK_LARGE_BYTES, LINK_MIN_BYTES
from ctxbuild.cache.layered import Cache
from ctxbuild.cache.local import LocalStore
from ctxbuild.cache.remote import RemoteStore
from ctxbuild.cache.store import Remote, shown_url

BACKENDS: dict[str, type[Remote]] = {"http": RemoteStore, "https": RemoteStore}


def open_remote(url: str, **options: Any) -> Remote:
    """The backend for the URL's scheme, constructed with `options` (see store.Remote); UsageError for a
    URL no backend takes."""
    try:
        scheme = urlsplit(url).scheme
    except ValueError:  # the backend's own check words it (without what the URL hides)
        scheme = url.partition("://")[0].lower()
    backend = BACKENDS.get(scheme)
    if backend is None:
        forms = " or ".join(sorted({b.URL_FORM for b in BACKENDS.values()}))
        raise UsageError(f"remote cache URL {shown_url(url)!r} is not {forms}")
    return backend(url, **options)


def open_cache(env: Mapping[str, str] | None = None, *, shared_breaker: bool = True) -> Cache | None:
    """The layered cache the settings describe (`env`, default this process's environment): None with
    CTXBUILD_NO_CACHE=1, else the local store in front of the remote one, if any. A remote that cannot be
    set up (a bad URL or number: plain `ninja` in OUT skips the driver's checks) is a warning in
    `cache.warnings`, and the cache works without it. `shared_breaker`: a remote found down is skipped by
    the build's other processes too (a marker in the local cache directory)."""
    if settings.NO_CACHE.get(env):
        return None
    root = cache_dir()
    remote, problem = None, None
    if url := settings.REMOTE_CACHE.get(env):
        token, _ = clean_token(settings.remote_token(env))
        try:
            remote = open_remote(url, token=token, read_only=settings.REMOTE_READ_ONLY.get(env),
                                 timeout=settings.REMOTE_TIMEOUT.get(env), state_dir=root if shared_breaker else None,
                                 min_rate=settings.REMOTE_MIN_RATE.get(env),
                                 max_download=settings.REMOTE_MAX_DOWNLOAD.get(env))
        except (CtxbuildError, ValueError) as e:
            problem = f"remote cache not used: {e}"
    link_min = {True: LINK_MIN_BYTES, False: None, None: LINK_LARGE_BYTES}[settings.CACHE_LINK.get(env)]
    cache = Cache(LocalStore(root, link_min=link_min), remote)
    if problem:
        cache.warnings.append(problem)
    return cache


def remote_warnings(env: Mapping[str, str]) -> list[str]:
    """The driver's check before a build: a malformed URL is a usage error (exit 2) here, once, not a failure
    of every action. A bad token, or a server skipped because it failed within the last minutes, is one
    warning per build, returned here."""
    url = settings.REMOTE_CACHE.get(env)
    if not url or settings.NO_CACHE.get(env):
        return []
    _, token_warning = clean_token(settings.remote_token(env))
    skipped = open_remote(url, state_dir=cache_dir()).skipped()
    return [w for w in (token_warning, skipped) if w]


def clean_token(raw: str | None) -> tuple[str | None, str | None]:
    """(token, warning): surrounding whitespace stripped (a secret file's newline); a token that is not
    printable ASCII cannot be an HTTP header value: dropped, with a warning that never shows it."""
    token = (raw or "").strip()
    if not token:
        return None, None
    if all(33 <= ord(c) <= 126 for c in token):
        return token, None
    return None, ("the remote cache token is not a valid HTTP header value (control, space or non-ASCII "
                  "characters inside it); using the remote cache without it")
