"""Content-addressed build cache, modelled on Bazel's remote cache: an action cache (key -> ActionRecord)
and a CAS of blobs by sha256 behind one store protocol (store.py), locally (LocalStore) and remotely (a
backend per URL scheme: RemoteStore for HTTP), layered by Cache and built from the settings by open_cache."""
from __future__ import annotations

from ctxbuild.cache.backends import open_cache
from ctxbuild.cache.layered import Cache
from ctxbuild.cache.local import LocalStore
from ctxbuild.cache.record import ActionRecord, OutputEntry
from ctxbuild.cache.remote import RemoteStore

__all__ = ["ActionRecord", "Cache", "LocalStore", "OutputEntry", "RemoteStore", "open_cache"]
