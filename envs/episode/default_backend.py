"""The backends environments use when given a name: one per name and options, per process."""

from __future__ import annotations

import atexit
import json
import threading
from collections.abc import Mapping
from typing import Any

from pool.backends import load_backend
from pool.contract import Backend

DEFAULT_BACKEND = "local"
_lock = threading.Lock()
_backends: dict[str, Backend] = {}


def shared_backend(name: str = DEFAULT_BACKEND, options: Mapping[str, Any] | None = None) -> Backend:
    """A process-wide backend of that name and options, opened on first use and closed at exit.

    Many environments of one process share it (one sandbox daemon, one engine
    connection); a backend that was closed or whose health failed is replaced.
    """
    key = json.dumps([name, dict(options or {})], sort_keys=True, default=str)
    with _lock:
        backend = _backends.get(key)
        if backend is None or backend.health is not None:
            backend = load_backend(name, **dict(options or {}))
            _backends[key] = backend
            atexit.register(backend.close)
        return backend
