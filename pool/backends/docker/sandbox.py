"""One sandbox of the Docker backend: a container at a time, handed over at each restore.

Why restore is a hand-off: a container cannot go back in time in place (a
commit freezes files, not the container's writable layer, and stopping and
cleaning a container costs as much as making one). So ``restore()`` kills
the episode's container (its init, and with it every process of its PID
namespace), hands the sandbox a spare container already started from the
target snapshot's image (``prewarm``), removes the old one on a background
thread, and starts the next spare there. The caller waits for a kill and a
swap; without a spare (the first restore to a new snapshot, or
``prewarm=False``) it waits for a container to be created and started.

Each sandbox does its own lifecycle (snapshot, restore, verification, spares, close) through
the :class:`~pool.backends.docker.link.EngineLink` it holds; its backend is a factory and
catalogue, which hands it a ``forget`` callback to drop it from the catalogue when it closes.

The sandbox's :attr:`id` stays the same across those containers (each
carries it as the ``snapgym.sandbox`` label); :attr:`container_id` is the
current one.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import posixpath
import time
from collections.abc import Callable, Mapping

from pool.backends.docker import verify
from pool.backends.docker.changes import read_changes
from pool.backends.docker.images.catalog import SNAPSHOT
from pool.backends.docker.link import EngineLink
from pool.backends.docker.transport import execution, files
from pool.basesandbox import BaseSandbox, ExecOptions
from pool.changes import MAX_PATHS, Changes
from pool.egress.onhost import setnetwork
from pool.errors import (
    CommandRejectedError,
    ConfigError,
    SandboxCrashedError,
    SandboxError,
    SandboxOutOfMemoryError,
    SnapgymError,
    UnsupportedError,
)
from pool.network.audit import NetworkLog
from pool.network.policy import NetworkPolicy, Phase
from pool.results import ExecResult, decode_output
from pool.snapshots import Snapshot
from pool.verification import VerificationPlan, VerificationReport, VerifyMode


class DockerSandbox(BaseSandbox):
    """A sandbox whose current state is one container of the engine."""

    def __init__(
        self,
        link: EngineLink,
        sandbox_id: str,
        container: str,
        snapshot: Snapshot,
        labels: Mapping[str, str],
        *,
        forget: Callable[[str], None] = lambda sandbox_id: None,
    ) -> None:
        super().__init__(snapshot)
        self._link = link
        self._settings = link.settings
        self._forget = forget
        self._id = sandbox_id
        self._container: str | None = container
        self._labels = dict(labels)
        self._sealed: VerifyMode | None = None
        self._spare: tuple[str, concurrent.futures.Future[str]] | None = None
        self._egress = link.egress.gatekeeper()

    # -- identity -------------------------------------------------------------

    @property
    def id(self) -> str:
        """The sandbox's name; every container it runs in carries it as the ``snapgym.sandbox`` label."""
        return self._id

    @property
    def container_id(self) -> str | None:
        """The container the sandbox runs in now (restore hands it another)."""
        return self._container

    @property
    def labels(self) -> dict[str, str]:
        """The caller's labels and the backend's (owner, sandbox, the snapshot of the current start)."""
        return {**self._labels, SNAPSHOT: self._snapshot.id}

    @property
    def container_labels(self) -> dict[str, str]:
        """The labels every container of this sandbox is made with."""
        return dict(self._labels)

    @property
    def is_alive(self) -> bool:
        """True while the sandbox's container runs."""
        if self._closed or self._container is None:
            return False
        return self._link.container_state(self._container).get("Running") is True

    @property
    def sealed(self) -> VerifyMode | None:
        """The verification mode in force since begin_verification(), or None."""
        return self._sealed

    # -- commands -----------------------------------------------------------------

    def _exec(self, command: str, options: ExecOptions) -> ExecResult:
        """:meth:`exec` through the container's helper (see :mod:`.transport.execution`), as the container's root.

        Raises:
            SandboxOutOfMemoryError: the container died because its processes used up its memory.
        """
        container = self._running()
        extra = {**self._egress.environment, **(options.env or {})}
        execution.check_command(command, {**self._snapshot.env, **extra}, options.timeout_s)
        stdin = options.stdin
        data = stdin.encode() if isinstance(stdin, str) else None if stdin is None else bytes(stdin)
        started = time.monotonic()
        outcome = execution.run(
            self._link.api,
            container,
            command,
            cwd=self._resolve(options.cwd or self._snapshot.workdir),
            env=extra,
            timeout_s=options.timeout_or(self._settings.default_timeout_s),
            stdin=data,
            cap=options.cap_or(self._settings.max_output_bytes),
            reap_all=self._sealed is not None,
        )
        duration = time.monotonic() - started
        if outcome.status is None:
            self._explain_missing_status(container)
            # the container lives: the command killed its helper (kill -9 -1), or stopped it past the backstop
            code, timed_out, out_cut, err_cut = 137, outcome.host_deadline_hit, False, False
            if outcome.not_started is not None:  # the engine started nothing, twice
                code = 126
                outcome.stderr.add(execution.not_started_message(outcome.not_started).encode())
            elif outcome.helper_pid is None and not timed_out:
                outcome.stderr.add(b"snapgym: the command's helper died before it could start the command\n")
        else:
            code, timed_out, out_cut, err_cut = outcome.status
        return ExecResult(
            exit_code=code,
            stdout=decode_output(outcome.stdout.value()),
            stderr=decode_output(outcome.stderr.value()),
            duration_s=duration,
            timed_out=timed_out,
            stdout_truncated=out_cut or outcome.stdout.truncated,
            stderr_truncated=err_cut or outcome.stderr.truncated,
        )

    def _explain_missing_status(self, container: str) -> None:
        state = self._link.container_state(container)
        if state.get("Running") is True:
            return
        if state.get("OOMKilled"):
            raise SandboxOutOfMemoryError(
                "the sandbox's processes used up its memory and its container died; restore() starts a new one"
            )
        raise SandboxCrashedError(
            f"the sandbox's container stopped ({state.get('Status', 'gone')}, exit {state.get('ExitCode')}); "
            "restore() starts a new one from its snapshot"
        )

    # -- files ----------------------------------------------------------------------

    def read_file(self, path: str, *, max_bytes: int | None = None, follow_symlinks: bool = True) -> bytes:
        """The bytes of a regular file in the sandbox, through the engine's archive API (the arguments
        and errors are :meth:`Sandbox.read_file <pool.contract.Sandbox.read_file>`'s)."""
        container = self._running()
        return files.read(
            self._link.api, container, self._resolve(path), max_bytes=max_bytes, follow_symlinks=follow_symlinks
        )

    def write_file(self, path: str, data: str | bytes, *, mode: int | None = None) -> None:
        """Write a file in the sandbox (mode 0644 unless given), creating parent folders.

        Raises:
            FileOperationError: the path cannot be written; ``.errno`` says why.
        """
        container = self._running()
        content = data.encode() if isinstance(data, str) else bytes(data)
        files.write(self._link.api, container, self._resolve(path), content, mode=mode)

    def _shell(self, command: str, options: ExecOptions) -> ExecResult:
        """Not available here (``Capabilities.shell_session`` is False): every command is an exec()."""
        raise UnsupportedError("docker: no persistent shell session; run commands with exec()")

    def changes(self, *, max_paths: int = MAX_PATHS) -> Changes:
        """The paths added, changed and removed since the sandbox's container started, as the
        engine lists them (see pool.backends.docker.changes); nothing runs in the container."""
        return read_changes(self._link.api, self._running(), max_paths=max_paths)

    def _resolve(self, path: str) -> str:
        if not isinstance(path, str) or "\0" in path or not path:
            raise CommandRejectedError(f"invalid sandbox path {path!r}")
        return posixpath.normpath(posixpath.join(self._snapshot.workdir, path))

    # -- lifecycle ------------------------------------------------------------------

    def snapshot(self) -> Snapshot:
        """Freeze the current files into a new image (the container is paused meanwhile; processes are not kept)."""
        container = self._running()
        if self._sealed is not None:
            raise SandboxError("the sandbox is sealed for its verifier; restore() it before taking a snapshot")
        return self._link.checkpoint(container, parent=self._snapshot, labels=self._labels)

    def restore(self, snapshot: Snapshot | None = None) -> None:
        """Kill every process of the episode and continue in a fresh container at ``snapshot``.

        Default: the last start. A prewarmed spare of that snapshot is handed over when
        there is one. Ends a verification.

        Raises:
            SnapshotNotFoundError: the snapshot's image is gone from the engine.
        """
        self._check_open()
        target = snapshot or self._snapshot
        self._link.check_snapshot(target)
        self._link.adopt_checkpoints(target, self._labels)
        self._egress.detach()
        self._egress.log()  # the last episode's records go with it
        if self._container is not None:
            self._link.containers.remove_later(self._container)  # killed now: every process is gone
            self._container = None
        self._sealed = None
        self._container = self.take_spare(target) or self._link.start_container(target, self._labels)
        self._snapshot = target
        self.prewarm()

    def begin_verification(self, plan: VerificationPlan) -> VerificationReport:
        """End the agent's turn: until restore(), commands and files are the verifier's.

        strict: a fresh container at ``plan.known_good`` with only the agent's outputs;
        shared: the agent's container, with /tests and a fresh reward folder (see
        :mod:`pool.backends.docker.verify` for what holds).

        Raises:
            ConfigError: the sandbox did not start from ``plan.known_good`` or a checkpoint of it.
            SandboxError: the sandbox is sealed already, or the verifier could not start.
        """
        container = self._running()
        if self._sealed is not None:
            raise SandboxError("the sandbox is sealed for its verifier already; restore() it first")
        if plan.mode is VerifyMode.SHARED and not self._settings.shared_verification:
            raise ConfigError(
                "shared verification on the Docker backend runs in the agent's container, where processes the "
                "agent left running can forge the reward; verify strictly, or opt in with "
                "DockerBackend(shared_verification=True)"
            )
        if plan.mode is VerifyMode.TOOLCHAIN:
            raise UnsupportedError(
                "toolchain verification is not built on the Docker backend yet (it would graft from `docker "
                "diff` of the stopped container); use the local backend, or verification=strict or shared"
            )
        link = self._link
        if plan.mode is VerifyMode.STRICT:
            self._egress.detach()  # the agent's container ends; the verifier's gets its own gate
            known_good = verify.known_good_of(plan, self._snapshot, check=link.check_snapshot)
            self._container, report = verify.strict(
                link.api, link.containers, container, plan, known_good=known_good, start_verifier=self._start_verifier
            )
        else:
            self._egress.seal()  # same namespace: nothing goes out until the verifier's policy is set
            known_good = verify.known_good_of(plan, self._snapshot, check=link.check_snapshot)
            report = verify.shared(link.api, link.hooks, container, plan, known_good=known_good)
        self._sealed = plan.mode
        return report

    def close(self) -> None:
        """Remove the sandbox's containers (its spare too). Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._egress.detach()
        if self._container is not None:
            self._link.containers.remove_later(self._container)
            self._container = None
        self._drop_spare()
        self._forget(self._id)

    # -- network ------------------------------------------------------------------------

    def set_network(self, policy: NetworkPolicy, *, phase: Phase) -> dict[str, str]:
        """Until restore(), reach only what ``policy`` allows, through the backend's egress proxy,
        which listens at 127.0.0.1:3128 inside the container's network namespace (see pool.egress).

        Raises:
            UnsupportedError: the backend cannot reach into containers and the policy is not no-network.
            SandboxCrashedError: the container is not running.
        """
        container = self._running()
        return setnetwork.set_network(
            self,
            policy,
            phase,
            egress=self._link.egress,
            gatekeeper=self._egress,
            netns_pid=lambda: self._netns_pid(container),
        )

    def network_log(self) -> NetworkLog:
        """The connection attempts since the last call or restore (see pool.network.audit)."""
        return self._egress.log()

    def _netns_pid(self, container: str) -> int:
        pid = int(self._link.container_state(container).get("Pid") or 0)
        if pid <= 0:
            raise SandboxCrashedError(f"sandbox {self.id}: its container is not running; restore() it")
        return pid

    # -- spares -----------------------------------------------------------------------

    def prewarm(self) -> None:
        """Start a spare container of the current start snapshot in the background (if the backend prewarms)."""
        if self._closed or not self._settings.prewarm or self._spare is not None:
            return
        snapshot = self._snapshot
        future = self._link.containers.later(self._link.start_container, snapshot, self._labels)
        self._spare = (snapshot.digest, future)

    def take_spare(self, snapshot: Snapshot) -> str | None:
        """The spare container if it is of ``snapshot`` and started; else None (and a spare of another is dropped)."""
        if self._spare is None:
            return None
        digest, future = self._spare
        if digest != snapshot.digest:
            self._drop_spare()
            return None
        self._spare = None
        try:
            return future.result()
        except SnapgymError:
            return None

    def _start_verifier(self, known_good: Snapshot) -> str:
        """The strict verifier's container: the spare when it is of ``known_good``, else a new one."""
        return self.take_spare(known_good) or self._link.start_container(known_good, self._labels, what="a verifier")

    def _drop_spare(self) -> None:
        if self._spare is None:
            return
        _, future = self._spare
        self._spare = None
        containers = self._link.containers

        def remove(done: concurrent.futures.Future[str]) -> None:
            with contextlib.suppress(Exception):
                containers.remove_now(done.result())

        future.add_done_callback(remove)

    # -- internals ----------------------------------------------------------------------

    def _running(self) -> str:
        self._check_open()
        if self._container is None:
            raise SandboxCrashedError(f"sandbox {self._id} has no container (a restore failed); restore() it again")
        return self._container

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        container = (self._container or "-")[:12]
        return f"<DockerSandbox {self._id} {state} container={container} snapshot={self._snapshot.id[:12]}>"
