"""The HTTP backend of the remote store (store.Remote, for http:// and https:// URLs): GET/PUT/HEAD on
<url>/ac/<key> and <url>/cas/<sha256>, the layout bazel-remote and nginx WebDAV serve (Bazel's HTTP cache
protocol: /ac/ values are REAPI ActionResults, see reapi.py).

Error contract (all CacheError subclasses; the token never appears in any of them):
- RemoteUnavailable: unreachable, timeout, connection broken mid-transfer, 5xx, or credentials refused.
  It trips a breaker: every later call in this process raises it again at once, so a dead server costs
  one timeout per process; with `state_dir`, a marker file there makes other processes of the same build
  (ninja runs one per action) skip the server for BREAKER_SECONDS too.
- CorruptEntry: a record or blob failed validation (poisoned or corrupt); nothing of it was kept.
- CacheError: anything else unexpected for one request (e.g. HTTP 413 on a big upload); no breaker.
Local file errors while writing a download (dest_path side) propagate as OSError.
"""
from __future__ import annotations

import base64
import hashlib
import io
import netrc
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from http.client import HTTPConnection, HTTPException, HTTPResponse, HTTPSConnection
from pathlib import Path
from typing import BinaryIO
from urllib.parse import SplitResult, unquote, urlsplit

from ctxbuild import settings
from ctxbuild.atomic import write_bytes
from ctxbuild.errors import CacheError, CorruptEntry, RemoteUnavailable, UsageError
from ctxbuild.cache import reapi
from ctxbuild.cache.files import CHUNK, temp_path
from ctxbuild.cache.record import ActionRecord, check_digest, check_key
from ctxbuild.cache.store import Remote, shown_parts, shown_url

BREAKER_SECONDS = 120.0
BREAKER_HINT = "not trying it again for a while; the build goes on without it"
RECORD_LIMIT = 16 << 20  # records are small; a bigger answer is a broken or hostile server
MAX_DOWNLOAD_SETTING = "cache.max_download in _defaults.yaml or --remote-max-download"
_STATUS_REASONS = {401: " (missing or wrong token)", 403: " (access denied)"}


class RemoteSkipped(RemoteUnavailable):
    """The breaker's marker says the server failed recently: skipped without a try. The process that tripped
    it warned, and the driver warns once when a build starts with the server skipped; no warning here."""


class RemoteStore(Remote):
    """`token` is sent as `Authorization: Bearer` (user:password in the URL as Basic auth); `read_only`
    never PUTs; `timeout` bounds connecting and each read; a whole transfer of n bytes gets
    `timeout + n / min_rate` seconds (a trickling server is abandoned); `state_dir` (the local cache
    root) holds the breaker's marker file shared with the build's other processes. No download brings more
    than the size its record declares, nor more than `max_download` bytes."""

    URL_FORM = "http(s)://host[:port][/path]"

    def __init__(self, url: str, *, token: str | None = None, read_only: bool = False,
                 timeout: float = settings.REMOTE_TIMEOUT.default, state_dir: Path | None = None,
                 min_rate: float = settings.REMOTE_MIN_RATE.default,
                 max_download: int = settings.REMOTE_MAX_DOWNLOAD.default) -> None:
        self.url = shown_url(url)
        try:  # urlsplit itself refuses some (an unclosed "[::1"), .port others (a port out of range)
            parts = urlsplit(url)
            port = parts.port
        except ValueError:
            parts, port = None, None
        if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
            raise UsageError(f"remote cache URL {self.url!r} is not {self.URL_FORM}")
        self._base = parts.path.rstrip("/")
        self._headers = _auth_headers(parts, token)
        proxy = proxy_for(parts)
        if proxy is None:
            connection = HTTPSConnection if parts.scheme == "https" else HTTPConnection
            self._connect = partial(connection, parts.hostname, port, timeout=timeout, blocksize=CHUNK)
        elif parts.scheme == "https":  # a CONNECT tunnel through the proxy; TLS end to end
            self._connect = partial(_tunnel, proxy, parts.hostname, port, timeout)
        else:  # a plain HTTP proxy: the request line names the whole URL
            self._connect = partial(HTTPConnection, proxy.hostname, proxy.port or 80, timeout=timeout, blocksize=CHUNK)
            self._base = f"http://{parts.hostname}:{port or 80}{self._base}"
            self._headers.update(_proxy_auth(proxy))
        self._idle: list[HTTPConnection] = []  # kept alive between requests; threads (prerestore) take their own
        self._lock = threading.Lock()
        self.read_only = read_only
        self.timeout = timeout
        self.min_rate = min_rate
        self.max_download = max_download
        marker = f"remote-down-{hashlib.sha256(self.url.encode()).hexdigest()[:16]}"
        self._marker = state_dir / marker if state_dir is not None else None
        self._down: str | None = None
        self._quiet = False  # the server was found down by another process (it warned), not by this one

    def __repr__(self) -> str:
        return f"RemoteStore({self.url!r}, read_only={self.read_only})"

    def get_record(self, key: str) -> ActionRecord | None:
        """The /ac/ entry (a REAPI ActionResult, see reapi.py) and the metadata blob it names, as a record.
        None if absent, in an older format, or its metadata blob is gone: a miss."""
        with self._exchange("GET", f"/ac/{check_key(key)}") as resp:
            if resp.status == 404:
                return None
            self._expect(resp, "GET", 200)
            body = io.BytesIO()
            for chunk in self._chunks(resp, RECORD_LIMIT):  # more is cut, and fails to decode below
                body.write(chunk)
        try:
            decoded = reapi.decode(body.getvalue())
            metadata = (self.read_blob(decoded.metadata.digest, min(decoded.metadata.size, RECORD_LIMIT))
                        if decoded is not None else None)
            return reapi.record_of(key, decoded, metadata) if decoded is not None and metadata is not None else None
        except ValueError:
            raise CorruptEntry(f"remote cache {self.url}: action record {key[:12]} is malformed (poisoned or "
                               "corrupt)", "ignored it; the action runs") from None

    def fetch_blob(self, digest: str, dest_path: Path, size: int | None = None) -> bool:
        """Download to a temp file beside `dest_path` and rename it there only once its sha256 matches.
        `size`: what the record declares (more is refused). False if the server lacks the blob."""
        tmp = temp_path(dest_path.parent, dest_path.name)
        try:
            with open(tmp, "xb") as f:
                if not self._download(digest, f, size):
                    return False
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, dest_path)
        finally:
            tmp.unlink(missing_ok=True)
        return True

    def read_blob(self, digest: str, size: int) -> bytes | None:
        """A small blob (a log, a record's metadata) of at most `size` bytes in memory, verified; None if
        the server lacks it."""
        buf = io.BytesIO()
        return buf.getvalue() if self._download(digest, buf, size) else None

    def has_blob(self, digest: str) -> bool:
        with self._exchange("HEAD", f"/cas/{check_digest(digest)}") as resp:
            if resp.status == 404:
                return False
            self._expect(resp, "HEAD", 200)
        return True

    def put_blob(self, digest: str, data: Path | bytes, *, overwrite: bool = False) -> bool:
        """Upload unless read-only or already there (HEAD first: blobs are big, HEADs cheap). True if sent.
        `overwrite`: the server's copy is known bad (failed its digest check): replace it."""
        if self.read_only or (not overwrite and self.has_blob(digest)):
            return False
        if isinstance(data, bytes):
            self._put(f"/cas/{digest}", data, len(data))
        else:
            with open(data, "rb") as f:
                self._put(f"/cas/{digest}", f, os.fstat(f.fileno()).st_size)
        return True

    def put_record(self, record: ActionRecord) -> bool:
        """Upload the record as an ActionResult, after its blobs and its metadata blob (so no reader sees an
        entry without them). True if sent."""
        if self.read_only:
            return False
        entry = reapi.encode(record)
        self.put_blob(entry.metadata_digest, entry.metadata)
        self._put(f"/ac/{check_key(record.key)}", entry.action_result, len(entry.action_result))
        return True

    def _download(self, digest: str, sink: BinaryIO, size: int | None) -> bool:
        """Stream the blob into `sink`, at most `size` (declared by its record) and `max_download` bytes."""
        if size is not None and size > self.max_download:
            raise CacheError(f"remote cache {self.url}: blob {digest[:12]} is {size} bytes, more than the "
                             f"{self.max_download} allowed", f"raise {MAX_DOWNLOAD_SETTING}; the action runs")
        bound = self.max_download if size is None else size
        what = "bytes its record declares (poisoned or corrupt)" if size is not None else "allowed"
        with self._exchange("GET", f"/cas/{check_digest(digest)}") as resp:
            if resp.status == 404:
                return False
            self._expect(resp, "GET", 200)
            h, received = hashlib.sha256(), 0
            for chunk in self._chunks(resp, bound):
                received += len(chunk)
                if received > bound:  # also a Content-Length over the bound: _chunks stops at bound + 1
                    message = f"remote cache {self.url}: blob {digest[:12]} is more than the {bound} {what}"
                    if size is None:
                        raise CacheError(message, f"raise {MAX_DOWNLOAD_SETTING}; the action runs")
                    raise CorruptEntry(message, "ignored it; the action runs", digest=digest)
                h.update(chunk)
                sink.write(chunk)
        if h.hexdigest() != digest:
            raise CorruptEntry(f"remote cache {self.url}: blob {digest[:12]} failed its sha256 check (poisoned "
                               "or corrupt)", "ignored it; the action runs", digest=digest)
        return True

    def _put(self, path: str, body: BinaryIO | bytes, size: int) -> None:
        if not isinstance(body, bytes):  # http.client reads a file body block by block: pace each block
            body = _Paced(body, time.monotonic() + self._allowed(size))
        with self._exchange("PUT", path, body, {"Content-Length": str(size)}) as resp:
            self._expect(resp, "PUT", 200, 201, 204)

    @contextmanager
    def _exchange(self, method: str, path: str, body: BinaryIO | bytes | None = None,
                  headers: dict[str, str] | None = None) -> Iterator[HTTPResponse]:
        """One request, on the connection the last one left open (HTTP/1.1 keep-alive: a restore of N blobs
        costs one TCP/TLS handshake, not N). A kept connection the server has closed meanwhile fails before
        any answer: the request goes once more on a fresh one (never a file body: it was read)."""
        self._check_breaker()
        with self._lock:
            conn = self._idle.pop() if self._idle else None
        reused, conn = conn is not None, conn or self._connect()
        keep = False
        try:
            try:
                try:
                    resp = self._send(conn, method, path, body, headers)
                except (ConnectionError, HTTPException):
                    if not reused or not (body is None or isinstance(body, bytes)):
                        raise
                    conn.close()
                    conn = self._connect()
                    resp = self._send(conn, method, path, body, headers)
            except (OSError, HTTPException) as e:
                raise self._trip(self._network_reason(e)) from None
            except ValueError:  # http.client's "Invalid header value ...": its text would show the token
                raise CacheError(f"remote cache {self.url}: a request header is not valid HTTP",
                                 "check the token (control characters?)") from None
            self._started = time.monotonic()
            yield resp
            if not resp.isclosed() and resp.length is not None and resp.length <= CHUNK:
                resp.read()  # what is left is short (a 404's page, an empty 201): read, and the connection stays
            keep = resp.isclosed() and not resp.will_close
        finally:
            if keep:
                with self._lock:
                    self._idle.append(conn)
            else:
                conn.close()

    def _send(self, conn: HTTPConnection, method: str, path: str, body: BinaryIO | bytes | None,
              headers: dict[str, str] | None) -> HTTPResponse:
        conn.request(method, self._base + path, body=body, headers={**self._headers, **(headers or {})})
        return conn.getresponse()

    def _chunks(self, resp: HTTPResponse, bound: int = RECORD_LIMIT) -> Iterator[bytes]:
        """The body as it arrives; never more than `bound` + 1 bytes are read (the caller sees the excess),
        whatever Content-Length says (a lying length would also buy a trickling server time)."""
        expected, received = resp.getheader("Content-Length"), 0
        size = int(expected) if expected is not None and expected.isdigit() else None
        if size is not None and size > bound:
            size = bound + 1
        while received <= bound:
            try:
                chunk = resp.read1(min(CHUNK, bound + 1 - received))  # whatever has arrived, up to CHUNK
            except (OSError, HTTPException) as e:
                raise self._trip(self._network_reason(e)) from None
            if not chunk:
                break
            received += len(chunk)
            elapsed = time.monotonic() - self._started
            if elapsed > self._allowed(max(size or 0, received)):
                raise self._trip(f"is too slow (sent {received} of {expected or '?'} bytes in {elapsed:.0f}s; "
                                 f"the minimum is {self.min_rate / 1024:g} KiB/s after {self.timeout:g}s)")
            yield chunk
        # http.client reports a body cut short by a dying server as a plain end of file.
        if size is not None and received < size:
            raise self._trip(f"broke the connection (sent {received} of {expected} bytes)")

    def _expect(self, resp: HTTPResponse, method: str, *ok: int) -> None:
        status = resp.status
        if status in ok:
            return
        if status >= 500 or (status in (401, 403) and method != "PUT"):
            raise self._trip(f"answered HTTP {status}{_STATUS_REASONS.get(status, '')}")
        if status in (401, 403):  # reads allowed, writes not: a common setup for developers' machines
            self.read_only = True
            raise CacheError(f"remote cache {self.url} refused an upload (HTTP {status})", "using it read-only")
        raise CacheError(f"remote cache {self.url}: unexpected HTTP {status} for {method}")

    def _allowed(self, size: int) -> float:
        return self.timeout + size / self.min_rate

    def _network_reason(self, e: BaseException) -> str:
        if isinstance(e, _TooSlow):
            return f"is too slow (an upload fell below {self.min_rate / 1024:g} KiB/s)"
        if isinstance(e, TimeoutError):
            return f"did not answer within {self.timeout:g}s"
        if isinstance(e, ConnectionRefusedError):
            return "refused the connection"
        if isinstance(e, HTTPException):
            return f"broke the connection ({type(e).__name__})"
        return f"is unreachable: {getattr(e, 'strerror', None) or type(e).__name__}"

    def _check_breaker(self) -> None:
        if self._down is None and self._marker is not None:
            try:
                if time.time() - self._marker.stat().st_mtime < BREAKER_SECONDS:
                    self._down = self._marker.read_text() or f"remote cache {self.url} is unavailable"
                    self._quiet = True
            except OSError:  # no marker: the server is presumed up
                pass
        if self._down is not None:
            raise (RemoteSkipped if self._quiet else RemoteUnavailable)(self._down, BREAKER_HINT)

    def skipped(self) -> str | None:
        """The breaker's message if another process found the server down within BREAKER_SECONDS."""
        try:
            self._check_breaker()
        except RemoteSkipped as e:
            return f"{e.message}, {time.time() - self._marker_mtime():.0f}s ago; skipped for this build " \
                   f"(tried again {BREAKER_SECONDS:.0f}s after the failure)"
        return None

    def _marker_mtime(self) -> float:
        try:
            return self._marker.stat().st_mtime if self._marker is not None else time.time()
        except OSError:
            return time.time()

    def _trip(self, reason: str) -> RemoteUnavailable:
        """The first process to find the server down warns (RemoteUnavailable); one that finds a fresh
        marker another process of this build just wrote stays quiet (RemoteSkipped)."""
        self._down = f"remote cache {self.url} {reason}"
        if self._marker is not None:
            try:
                self._marker.parent.mkdir(parents=True, exist_ok=True)
                if time.time() - self._marker_mtime() < BREAKER_SECONDS and self._marker.exists():
                    self._quiet = True
                    return RemoteSkipped(self._down, BREAKER_HINT)
                write_bytes(self._marker, self._down.encode(), self._marker.parent)
            except OSError:  # e.g. a read-only cache dir: only this process remembers
                pass
        return RemoteUnavailable(self._down, BREAKER_HINT)


class _TooSlow(OSError):
    pass


class _Paced:
    """A file body that fails the upload once it falls behind `timeout + size / min_rate`."""

    def __init__(self, f: BinaryIO, deadline: float) -> None:
        self._f, self._deadline = f, deadline

    def read(self, n: int = -1) -> bytes:
        if time.monotonic() > self._deadline:
            raise _TooSlow("upload too slow")
        return self._f.read(n)


def proxy_for(parts: SplitResult) -> SplitResult | None:
    """The proxy for this URL from HTTPS_PROXY / HTTP_PROXY (or lowercase), unless NO_PROXY exempts the host:
    the standard library's reading of them (urllib.request), as curl, pip and requests read them."""
    from urllib.request import getproxies_environment, proxy_bypass_environment

    proxies = getproxies_environment()
    proxy = proxies.get(parts.scheme)
    if not proxy or proxy_bypass_environment(parts.hostname or "", proxies):
        return None
    p = urlsplit(proxy if "://" in proxy else f"http://{proxy}")
    if p.scheme != "http" or not p.hostname:
        raise UsageError(f"proxy {shown_parts(p)!r} for the remote cache is not http://host[:port]")
    return p


def _tunnel(proxy: SplitResult, host: str, port: int | None, timeout: float) -> HTTPSConnection:
    conn = HTTPSConnection(proxy.hostname, proxy.port or 80, timeout=timeout, blocksize=CHUNK)
    conn.set_tunnel(host, port or 443, headers=_proxy_auth(proxy))
    return conn


def _proxy_auth(proxy: SplitResult) -> dict[str, str]:
    if proxy.username is None:
        return {}
    pair = f"{unquote(proxy.username)}:{unquote(proxy.password or '')}".encode()
    return {"Proxy-Authorization": f"Basic {base64.b64encode(pair).decode()}"}


def _auth_headers(parts: SplitResult, token: str | None) -> dict[str, str]:
    if token:
        return {"Authorization": f"Bearer {token}"}
    if parts.username is not None:  # http://user:pass@host, as bazel-remote's htpasswd auth expects
        return _basic(unquote(parts.username), unquote(parts.password or ""))
    login = _netrc_login(parts.hostname or "")
    return _basic(*login) if login else {}


def _basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": f"Basic {base64.b64encode(f'{user}:{password}'.encode()).decode()}"}


def _netrc_login(host: str) -> tuple[str, str] | None:
    """(login, password) for `host` from $NETRC, else ~/.netrc, as curl and pip read it; None without one."""
    try:
        entry = netrc.netrc(os.environ.get("NETRC") or None).authenticators(host)
    except (OSError, netrc.NetrcParseError):  # no file, unreadable, or malformed: no credentials
        return None
    return (entry[0], entry[2] or "") if entry else None
