"""The embedded local backend (Linux namespaces + overlayfs layers)."""

from pool.backends.local.backend import LocalBackend
from pool.backends.local.sandbox import LocalSandbox

__all__ = ["LocalBackend", "LocalSandbox"]
