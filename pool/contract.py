"""The sandbox contract every backend implements, as Protocols."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from pool.capabilities import Capabilities
from pool.changes import MAX_PATHS, Changes
from pool.network.audit import NetworkLog
from pool.network.policy import NetworkPolicy, Phase
from pool.results import ExecResult
from pool.snapshots import Snapshot
from pool.templates import Template
from pool.verification import VerificationPlan, VerificationReport

SHELL_STATE_FILE = "/run/.snapgym-shell-state"
"""Where a shell that runs an agent's steps (``Sandbox.shell``, ``snapgym/Shell-v0``) keeps its working
directory and exported variables between steps: a script that ``cd``s and re-exports."""


@runtime_checkable
class Sandbox(Protocol):
    """One isolated machine state that runs commands and can go back in time."""

    @property
    def id(self) -> str:
        """The backend's name for this sandbox (a container id, a provider's sandbox id, ...)."""

    @property
    def labels(self) -> Mapping[str, str]:
        """Who the sandbox belongs to (``run``, ``pool``, ``attempt``, ...), as given at creation
        plus the backend's own (``snapgym.owner``, by which ``reap_orphans`` finds it)."""

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

    def shell(
        self,
        command: str,
        *,
        timeout_s: float | None = None,
        env: Mapping[str, str] | None = None,
        max_output_bytes: int | None = None,
    ) -> ExecResult:
        """Run a command in the sandbox's persistent shell, which keeps its working directory and
        variables until restore() (``capabilities.shell_session``; False: raises UnsupportedError)."""

    def read_file(self, path: str, *, max_bytes: int | None = None, follow_symlinks: bool = True) -> bytes:
        """Bytes of a regular file in the sandbox.

        Args:
            path: absolute, or relative to the snapshot's workdir.
            max_bytes: refuse a larger file (EFBIG).
            follow_symlinks: False refuses a link as the last component (ELOOP).

        Raises:
            FileOperationError: missing, a directory, not a regular file (a FIFO, say), unreadable, or
                larger than ``max_bytes``; ``.errno`` says which.
        """

    def write_file(self, path: str, data: str | bytes, *, mode: int | None = None) -> None:
        """Write a file in the sandbox, creating parent directories."""

    def snapshot(self) -> Snapshot:
        """Freeze the current state into an immutable Snapshot."""

    def restore(self, snapshot: Snapshot | None = None) -> None:
        """Go back to a snapshot (default: the last start); every process of the episode is gone first."""

    def begin_verification(self, plan: VerificationPlan) -> VerificationReport:
        """End the agent's turn; until restore(), commands and files are the verifier's (see pool.verification)."""

    def set_network(self, policy: NetworkPolicy, *, phase: Phase) -> Mapping[str, str]:
        """Until the next restore(), the sandbox may reach only what ``policy`` allows, and its attempts
        are recorded as ``phase``'s. Every command gets the returned variables (the proxy's address, a
        CA bundle); ``begin_verification`` ends the agent's phase, so call it again for the verifier.

        Raises:
            UnsupportedError: the backend cannot enforce the policy (``capabilities.network_modes``).
        """

    def changes(self, *, max_paths: int = MAX_PATHS) -> Changes:
        """The paths added, changed and removed since the sandbox started (``Capabilities.changes``
        says who lists them; "none": raises UnsupportedError)."""

    def network_log(self) -> NetworkLog:
        """The connection attempts since the last call (empty where ``capabilities.egress_audit`` is False)."""

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

    @classmethod
    def resolve_options(cls, options: Mapping[str, Any]) -> dict[str, Any]:
        """The constructor's options completed in this process, before they travel to others.

        A pool makes one backend per node from the driver's options; defaults that depend on
        where the code runs (the store folder, an engine address from the environment) are
        settled here, in the driver, so every node's backend is configured alike.
        """

    @classmethod
    def unavailable_reason(cls, **options: Any) -> str | None:
        """None when a backend with these options can run on this machine; otherwise why not
        (no engine reachable, no credentials, an unsupported kernel). Cheap: no sandbox starts."""

    @property
    def capabilities(self) -> Capabilities:
        """What this backend truthfully does."""

    @property
    def health(self) -> str | None:
        """None while the backend can serve; otherwise why not (its daemon died, its engine is gone)."""

    def build(self, template: Template) -> Snapshot:
        """The snapshot of a template, built or found in the cache."""

    def create(self, snapshot: Snapshot, *, labels: Mapping[str, str] | None = None) -> Sandbox:
        """A sandbox starting at a snapshot, carrying ``labels``."""

    def fork(self, snapshot: Snapshot, n: int, *, labels: Mapping[str, str] | None = None) -> Sequence[Sandbox]:
        """n sandboxes each starting at a snapshot."""

    def reap_orphans(self) -> int:
        """Remove sandboxes and leftovers of runs whose process is gone; returns how many runs."""

    def close(self) -> None:
        """Close every sandbox and release resources. Idempotent."""


# -- optional features: a backend or sandbox that offers one satisfies its Protocol -------------------
# Callers ask ``isinstance(backend, ReapsRuns)``; they never probe attribute names.


@runtime_checkable
class DeclaresCapabilities(Protocol):
    """A backend class that says its capabilities before any instance exists (a cloud backend's are
    fixed by its provider), so a config can be refused without connecting."""

    @classmethod
    def declared_capabilities(cls) -> Capabilities:
        """The capabilities every instance of the class has."""


@runtime_checkable
class DeclaresCapabilityRange(Protocol):
    """A backend class whose capabilities depend on the machine or its options (what the kernel or the
    engine offers, running as root), and that says before any instance exists what they can be: the
    documentation's table (``python -m pool.backends --markdown``) comes from this."""

    @classmethod
    def capability_range(cls) -> Mapping[str, Capabilities]:
        """The capabilities on a typical machine with the default options first, keyed by that machine;
        then, keyed by each condition that changes some of them, the capabilities under that condition
        alone (the rest as on the typical machine)."""


@runtime_checkable
class ReapsRuns(Protocol):
    """A backend that can list its sandboxes by run, from any machine (``python -m pool.backends.reap --run``)."""

    def reap_run(self, run: str, *, dry_run: bool = False) -> list[str]:
        """End every sandbox (and checkpoint) labelled with the run; what it ended, or would end."""


@runtime_checkable
class ReapsLabelled(Protocol):
    """A backend that can end the sandboxes carrying some labels, whoever made them (a dead host's)."""

    def reap_labelled(self, labels: Mapping[str, str]) -> int:
        """End every sandbox carrying ``labels``; how many."""


@runtime_checkable
class KeepsRunCheckpoints(Protocol):
    """A backend whose checkpoints would go with it on close, unless asked to keep them for a resume."""

    def keep_run_checkpoints(self) -> int:
        """Leave this run's checkpoints when the backend closes; how many stay."""


@runtime_checkable
class RunsBeside(Protocol):
    """A sandbox held in another process (a pool's lease) that can run a function where the sandbox is."""

    def run_beside(self, function: Callable[..., Any], args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
        """``function(sandbox, *args, **kwargs)``, run in the process that holds the sandbox."""


@runtime_checkable
class ReportsReuse(Protocol):
    """A sandbox whose instances may reuse kernel objects of dead ones, each proven clean first (the local
    backend's emptied cgroups and network namespaces)."""

    @property
    def reused(self) -> Mapping[str, bool]:
        """What the current instance got from a dead one, e.g. ``{"cgroup": True, "netns": False}``."""


@runtime_checkable
class ListsVerifierView(Protocol):
    """A sandbox that can list what its strict verifier sees from the host, with no process in the sandbox
    (the protection scan of ``envs.tasks.protect``; the local backend's sandboxes)."""

    def list_verifier_view(self, roots: Sequence[str], patterns: Sequence[str]) -> dict[str, tuple[str, int]] | None:
        """The entries below ``roots`` whose name matches a glob of ``patterns``, as ``find ROOTS -mindepth 1
        \\( -name P -o ... \\) -prune -printf '%y %m %p'`` run by the verifier lists them, ``path -> (kind, mode)``
        with kind ``f``, ``d`` or ``l``; matched folders are not entered and no link is followed. None when the
        sandbox is not sealed for a strict verifier or the host cannot list them exactly so (then run ``find``)."""


@runtime_checkable
class RunsScripts(Protocol):
    """A sandbox that runs a script with its interpreter and no shell started in front of it (the verifier's
    ``test.sh``: one program start instead of two; the local backend's sandboxes)."""

    def run_script(
        self,
        path: str,
        *,
        cwd: str,
        timeout_s: float | None = None,
        env: Mapping[str, str] | None = None,
        max_output_bytes: int | None = None,
    ) -> ExecResult:
        """What ``exec(f"cd -- {cwd} 2>/dev/null || cd /\\n{run_script_command(path)}", cwd="/", ...)`` does
        (``envs.tasks.verifier.run_script_command``): ``/bin/bash path`` (``/bin/sh path`` where ``/bin/bash``
        cannot be run) in ``cwd`` (in ``/`` where ``cwd`` cannot be entered); the options and result are
        :meth:`Sandbox.exec`'s."""
