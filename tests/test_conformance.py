"""The local backend passes the conformance suite every backend must pass."""

from __future__ import annotations

from pool import LocalBackend
from pool.testing import check_backend


def test_local_backend_passes_check_backend(backend: LocalBackend) -> None:
    check_backend(backend)
