"""snapgym's sandbox layer: the contract, the values, the errors, the backends.

>>> from pool import LocalBackend, Template
>>> backend = LocalBackend()
>>> snap = backend.build(Template(name="demo", setup=["echo hi > a"], workdir="/workspace"))
>>> with backend.create(snap) as sbx:
...     sbx.exec("cat a").stdout
'hi\\n'
"""

from pool.backends import load_backend
from pool.backends.local import LocalBackend, LocalSandbox
from pool.capabilities import Capabilities, Enforcement
from pool.contract import Backend, Sandbox
from pool.errors import (
    BackendError,
    BuildError,
    CommandRejectedError,
    CompilerMissingError,
    ConfigError,
    FileOperationError,
    SandboxClosedError,
    SandboxCrashedError,
    SandboxError,
    SnapgymError,
    SnapshotError,
    SnapshotNotFoundError,
    UnsupportedError,
)
from pool.results import ExecResult
from pool.snapshots import Snapshot
from pool.templates import Template

__all__ = [
    "Backend",
    "BackendError",
    "BuildError",
    "Capabilities",
    "CommandRejectedError",
    "CompilerMissingError",
    "ConfigError",
    "Enforcement",
    "ExecResult",
    "FileOperationError",
    "LocalBackend",
    "LocalSandbox",
    "Sandbox",
    "SandboxClosedError",
    "SandboxCrashedError",
    "SandboxError",
    "SnapgymError",
    "Snapshot",
    "SnapshotError",
    "SnapshotNotFoundError",
    "Template",
    "UnsupportedError",
    "load_backend",
]
