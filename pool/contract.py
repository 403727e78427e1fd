"""The sandbox contract every backend implements, as Protocols."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol, runtime_checkable

from pool.capabilities import Capabilities
from pool.results import ExecResult
from pool.snapshots import Snapshot
from pool.templates import Template
from pool.verification import VerificationPlan, VerificationReport


@runtime_checkable
class Sandbox(Protocol):
    """One isolated machine state that runs commands and can go back in time."""

    @property
    def start_snapshot(self) -> Snapshot:
        """The snapshot the sandbox last started from."""

    @property
    def start_digest(self) -> str:
        """Digest of that snapshot's content."""

    @property
    def is_closed(self) -> bool:
        """True after close()."""

    @property
    def is_alive(self) -> bool:
        """True while the sandbox can take commands."""

    def exec(
        self,
        command: str,
        *,
        timeout_s: float | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: str | bytes | None = None,
        max_output_bytes: int | None = None,
    ) -> ExecResult:
        """Run a shell command; a non-zero exit is data, not an exception."""

    def read_file(self, path: str, *, max_bytes: int | None = None, follow_symlinks: bool = True) -> bytes:
        """Bytes of a regular file in the sandbox (``follow_symlinks=False`` refuses a final link)."""

    def write_file(self, path: str, data: str | bytes, *, mode: int | None = None) -> None:
        """Write a file in the sandbox, creating parent directories."""

    def snapshot(self) -> Snapshot:
        """Freeze the current state into an immutable Snapshot."""

    def restore(self, snapshot: Snapshot | None = None) -> None:
        """Go back to a snapshot (default: the last start); every process of the episode is gone first."""

    def begin_verification(self, plan: VerificationPlan) -> VerificationReport:
        """End the agent's turn; until restore(), commands and files are the verifier's (see pool.verification)."""

    def close(self) -> None:
        """Release the sandbox. Idempotent."""

    def __enter__(self) -> Sandbox:
        """Use as a context manager; closes on exit."""

    def __exit__(self, *exc: object) -> None:
        """Close the sandbox."""


@runtime_checkable
class Backend(Protocol):
    """Builds snapshots and starts sandboxes from them."""

    name: str

    @property
    def capabilities(self) -> Capabilities:
        """What this backend truthfully does."""

    def build(self, template: Template) -> Snapshot:
        """The snapshot of a template, built or found in the cache."""

    def create(self, snapshot: Snapshot) -> Sandbox:
        """A sandbox starting at a snapshot."""

    def fork(self, snapshot: Snapshot, n: int) -> Sequence[Sandbox]:
        """n sandboxes each starting at a snapshot."""

    def close(self) -> None:
        """Close every sandbox and release resources. Idempotent."""
