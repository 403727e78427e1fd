"""snapgym's sandbox layer: the contract, the values, the errors, the backends.

>>> from pool import Template, load_backend
>>> backend = load_backend("local")            # or "docker", with its options as keywords
>>> snap = backend.build(Template(name="demo", setup=["echo hi > a"], workdir="/workspace"))
>>> with backend.create(snap) as sbx:
...     sbx.exec("cat a").stdout
'hi\\n'
"""

import typing as _typing

from pool.backends import BACKENDS, available_backends, backend_options, load_backend
from pool.capabilities import Capabilities, ChangesSource, EgressControl, Enforcement, Location, VerifierIsolation
from pool.contract import Backend, Sandbox
from pool.errors import (
    AcquireTimeoutError,
    BackendError,
    BuildError,
    CommandRejectedError,
    CompilerMissingError,
    ConfigError,
    CrashLoopError,
    DockerfileError,
    FileOperationError,
    HostBrokenError,
    ImageError,
    LeaseLostError,
    PoolClosedError,
    PoolError,
    RegistryUnreachableError,
    SandboxClosedError,
    SandboxCrashedError,
    SandboxEndedError,
    SandboxError,
    SandboxOutOfMemoryError,
    SnapgymError,
    SnapshotError,
    SnapshotNotFoundError,
    UnsupportedError,
)
from pool.resources import Resources
from pool.results import ExecResult
from pool.snapshots import Snapshot
from pool.templates import DockerBuild, Template

if _typing.TYPE_CHECKING:
    from pool.backends.docker import DockerBackend
    from pool.backends.local import LocalBackend, LocalSandbox
    from pool.cluster.config import PoolConfig
    from pool.cluster.lease import Lease
    from pool.cluster.sandbox_pool import SandboxPool
    from pool.cluster.slots import SlotState

_LAZY = {
    "LocalBackend": "pool.backends.local",
    "LocalSandbox": "pool.backends.local",
    "DockerBackend": "pool.backends.docker",
    "SandboxPool": "pool.cluster.sandbox_pool",
    "PoolConfig": "pool.cluster.config",
    "Lease": "pool.cluster.lease",
    "SlotState": "pool.cluster.slots",
}


def __getattr__(name: str) -> object:
    """Backends and the Ray-backed pool classes, imported on first use (Ray is slow to import;
    a backend brings its provider's SDK)."""
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'pool' has no attribute {name!r}")


__all__ = [
    "BACKENDS",
    "AcquireTimeoutError",
    "Backend",
    "BackendError",
    "BuildError",
    "Capabilities",
    "CommandRejectedError",
    "CompilerMissingError",
    "ConfigError",
    "CrashLoopError",
    "DockerBackend",
    "DockerBuild",
    "DockerfileError",
    "ChangesSource",
    "EgressControl",
    "Enforcement",
    "Location",
    "VerifierIsolation",
    "ExecResult",
    "FileOperationError",
    "HostBrokenError",
    "ImageError",
    "RegistryUnreachableError",
    "LocalBackend",
    "Lease",
    "LeaseLostError",
    "LocalSandbox",
    "PoolClosedError",
    "PoolConfig",
    "PoolError",
    "Resources",
    "Sandbox",
    "SandboxClosedError",
    "SandboxCrashedError",
    "SandboxEndedError",
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
    "available_backends",
    "backend_options",
    "load_backend",
]
