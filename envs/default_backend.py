"""The backend environments use when none is given: one LocalBackend per process."""

from __future__ import annotations

import atexit
import threading

from pool.backends.local import LocalBackend
from pool.contract import Backend

_lock = threading.Lock()
_backend: LocalBackend | None = None


def shared_backend() -> Backend:
    """A process-wide LocalBackend, started on first use and closed at exit."""
    global _backend
    with _lock:
        if _backend is None or _backend.is_closed:
            _backend = LocalBackend()
            atexit.register(_backend.close)
        return _backend
