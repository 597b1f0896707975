"""Content-addressed build cache, modelled on Bazel's remote cache: an action cache (key -> ActionRecord)
and a CAS of blobs by sha256, locally (LocalStore) and over HTTP (RemoteStore), layered by Cache."""
from __future__ import annotations

from ..layout import cache_dir as default_cache_dir
from .layered import Cache
from .local import LocalStore
from .record import ActionRecord, OutputEntry
from .remote import RemoteStore

__all__ = ["ActionRecord", "Cache", "LocalStore", "OutputEntry", "RemoteStore", "default_cache_dir"]
