"""Content-addressed build cache, modelled on Bazel's remote cache: an action cache (key -> ActionRecord)
and a CAS of blobs by sha256, locally (LocalStore) and over HTTP (RemoteStore), layered by Cache."""
from __future__ import annotations

from ctxbuild.layout import cache_dir as default_cache_dir
from ctxbuild.cache.layered import Cache
from ctxbuild.cache.local import LocalStore
from ctxbuild.cache.record import ActionRecord, OutputEntry
from ctxbuild.cache.remote import RemoteStore

__all__ = ["ActionRecord", "Cache", "LocalStore", "OutputEntry", "RemoteStore", "default_cache_dir"]
