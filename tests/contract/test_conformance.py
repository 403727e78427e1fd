"""Every backend this machine can run passes the conformance suite (pool.testing.check_backend)."""

from __future__ import annotations

from pool import Backend
from pool.testing import check_backend


def test_backend_passes_check_backend(any_backend: Backend) -> None:
    check_backend(any_backend)
