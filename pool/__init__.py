"""snapgym's sandbox layer: the contract, the values, the errors, the backends.

>>> from pool import LocalBackend, Template
>>> backend = LocalBackend()
>>> snap = backend.build(Template(name="demo", setup=["echo hi > a"], workdir="/workspace"))
>>> with backend.create(snap) as sbx:
...     sbx.exec("cat a").stdout
'hi\\n'
"""

import typing as _typing

from pool.backends import load_backend
from pool.backends.local import LocalBackend, LocalSandbox
from pool.capabilities import Capabilities, Enforcement
from pool.contract import Backend, Sandbox
from pool.errors import (
    AcquireTimeoutError,
    BackendError,
    BuildError,
    CommandRejectedError,
    CompilerMissingError,
    ConfigError,
    CrashLoopError,
    FileOperationError,
    LeaseLostError,
    PoolClosedError,
    PoolError,
    SandboxClosedError,
    SandboxCrashedError,
    SandboxError,
    SandboxOutOfMemoryError,
    SnapgymError,
    SnapshotError,
    SnapshotNotFoundError,
    UnsupportedError,
)
from pool.results import ExecResult
from pool.snapshots import Snapshot
from pool.templates import Template

if _typing.TYPE_CHECKING:
    from pool.lease import Lease
    from pool.pool_config import PoolConfig
    from pool.sandbox_pool import SandboxPool
    from pool.slots import SlotState

_LAZY = {
    "SandboxPool": "pool.sandbox_pool",
    "PoolConfig": "pool.pool_config",
    "Lease": "pool.lease",
    "SlotState": "pool.slots",
}


def __getattr__(name: str) -> object:
    """The Ray-backed pool classes, imported on first use (Ray is slow to import)."""
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'pool' has no attribute {name!r}")


__all__ = [
    "AcquireTimeoutError",
    "Backend",
    "BackendError",
    "BuildError",
    "Capabilities",
    "CommandRejectedError",
    "CompilerMissingError",
    "ConfigError",
    "CrashLoopError",
    "Enforcement",
    "ExecResult",
    "FileOperationError",
    "LocalBackend",
    "Lease",
    "LeaseLostError",
    "LocalSandbox",
    "PoolClosedError",
    "PoolConfig",
    "PoolError",
    "Sandbox",
    "SandboxClosedError",
    "SandboxCrashedError",
    "SandboxOutOfMemoryError",
    "SandboxError",
    "SandboxPool",
    "SnapgymError",
    "Snapshot",
    "SnapshotError",
    "SlotState",
    "SnapshotNotFoundError",
    "Template",
    "UnsupportedError",
    "load_backend",
]
