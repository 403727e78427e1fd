"""One sandbox of the local backend, the facade of its lifecycle: exec, files, snapshot, restore, verification.

The sandbox runs its own lifecycle (start, snapshot, restore, seal, close) through the narrow
link it holds (``pool.backends.local.instance.link``: its number and the backend's ``Runtime``, which has
the daemon, the store and the frozen settings); it never reaches its backend. The backend is its
factory and catalogue: it hands each sandbox a ``forget`` callback to drop it from the catalogue.
How a command reaches the daemon, and the episode's shell, are its ``Console``'s (``.instance.console``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from pool.backends.local.cgroups import Limits, SandboxCgroup, reused_of
from pool.backends.local.daemon.client import Op, PendingReply
from pool.backends.local.instance import checkpoint, commands, seal, viewscan
from pool.backends.local.instance.checkpoint import BuildResult
from pool.backends.local.instance.console import Console
from pool.backends.local.instance.link import SandboxLink
from pool.backends.local.runtime import Runtime
from pool.backends.local.store import upperread
from pool.backends.local.store.changes import read_changes
from pool.basesandbox import BaseSandbox, ExecOptions
from pool.changes import MAX_PATHS, Changes
from pool.egress.onhost import setnetwork
from pool.errors import SandboxCrashedError, SandboxError
from pool.network.audit import NetworkLog
from pool.network.policy import NetworkPolicy, Phase
from pool.results import ExecResult
from pool.snapshots import Snapshot
from pool.verification import VerificationPlan, VerificationReport, VerifyMode
from pool.verification.installs import InstallDelta


class LocalSandbox(BaseSandbox):
    """A sandbox in its own namespaces over a snapshot's read-only layers."""

    def __init__(
        self,
        runtime: Runtime,
        number: int,
        snapshot: Snapshot,
        labels: Mapping[str, str],
        *,
        forget: Callable[[int], None],
    ) -> None:
        super().__init__(snapshot)
        settings = runtime.settings
        self._runtime = runtime
        self._settings = settings
        self._link = SandboxLink(runtime, number)
        self._forget = forget
        self.number = number
        """The daemon's number for this sandbox."""
        self._id = f"{settings.tag}-{number}"
        self._labels = dict(labels)
        resources = snapshot.resources
        self._cgroup = SandboxCgroup(self._id, settings.limits(resources), settings.limited_controllers(resources))
        self._sealed: VerifyMode | None = None
        self._private: tuple[str, ...] = ()
        """A strict verifier's private directories: they live in the writable layer."""
        self.stage_path = ""
        """Where the sandbox's writable tmpfs is mounted (in its keeper's mount namespace)."""
        self.keeper_pid = 0
        """The host pid of the sandbox's keeper, whose mount namespace holds its stages."""
        self._init_pid = 0
        """The host pid of the init the keeper's last start, restore or seal named (0: ask it)."""
        self._egress = runtime.egress.gatekeeper()
        self._console = Console(self._link, self._cgroup, self._egress)
        self._reused: dict[str, bool] = {}

    # -- start ------------------------------------------------------------

    def start(self, *, network: bool, spare: bool = True) -> PendingReply:
        """Ask the daemon for this sandbox's first instance; the reply is for :meth:`finish_start`.

        ``network``: the host's network (a build); ``spare`` False: no spare until the first
        restore (which then builds one). On an error the sandbox's cgroup is removed.
        """
        try:
            fields = self._runtime.instance_fields(self._snapshot, network=network, cgroup=self._cgroup, spare=spare)
            return self._runtime.submit(Op.CREATE, self.number, fields)
        except BaseException:
            self._cgroup.remove()
            raise

    def finish_start(self, pending: PendingReply) -> None:
        """Wait for the reply of :meth:`start`; on an error the cgroup is removed and it is raised."""
        try:
            reply = pending.result()
            self.stage_path, self.keeper_pid = reply["stage"], int(reply["keeper"])
            self._init_pid, self._reused = int(reply.get("pid", "0")), reused_of(reply)
        except BaseException:
            self._cgroup.remove()
            raise

    @property
    def stage_dir(self) -> Path:
        """The sandbox's writable tmpfs (its instance's stage), seen through its keeper's mount namespace."""
        return Path(f"/proc/{self.keeper_pid}/root/{self.stage_path.lstrip('/')}")

    @property
    def upper_dir(self) -> Path:
        """The current instance's writable layer (``upper`` in its stage), seen as :attr:`stage_dir` is."""
        return Path(f"/proc/{self.keeper_pid}/root/{self.stage_path.lstrip('/')}/upper")

    # -- identity ---------------------------------------------------------

    @property
    def id(self) -> str:
        """``<backend tag>-<number>``: unique on this machine while the backend runs."""
        return self._id

    @property
    def labels(self) -> Mapping[str, str]:
        """The labels given at creation plus ``snapgym.owner``."""
        return dict(self._labels)

    def relabel(self, labels: Mapping[str, str]) -> None:
        """Carry ``labels`` from now on (a ready sandbox handed to the create() that asked for them)."""
        self._labels = dict(labels)

    @property
    def is_alive(self) -> bool:
        """True while the sandbox's init runs and can take commands."""
        if self._closed or not self._runtime.daemon_is_alive:
            return False
        return self._link.ping().get("pid", "0") != "0"

    @property
    def reused(self) -> Mapping[str, bool]:
        """What the current instance (after a strict seal, the verifier's) got from a dead one, proven clean."""
        return dict(self._reused)

    @property
    def died_of_oom(self) -> bool:
        """True when the sandbox's init died while the OOM killer was at work in its cgroup."""
        if self._closed or not self._runtime.daemon_is_alive:
            return False
        return self._link.ping().get("died") == "oom"

    def use_limits(self, limits: Limits, controllers: set[str]) -> None:
        """Limits for the next instance (set before a restore)."""
        self._cgroup.set_limits(limits, controllers)

    def memory_bytes(self) -> int | None:
        """Memory charged to the sandbox right now, where a memory cgroup exists."""
        return self._cgroup.memory_bytes()

    # -- commands -----------------------------------------------------------

    def _exec(self, command: str, options: ExecOptions) -> ExecResult:
        """:meth:`exec` by the sandbox's daemon, as root inside the sandbox (see :mod:`.instance.console`)."""
        self._check_open()
        return self._console.exec(command, options, self._snapshot, sealed=self._sealed is not None)

    def run_script(
        self,
        path: str,
        *,
        cwd: str,
        timeout_s: float | None = None,
        env: Mapping[str, str] | None = None,
        max_output_bytes: int | None = None,
    ) -> ExecResult:
        """``/bin/bash path`` (or ``/bin/sh``) in ``cwd`` (or ``/``), started by the sandbox's init with no
        ``sh -c`` in front (see pool.contract.RunsScripts)."""
        self._check_open()
        options = ExecOptions(timeout_s=timeout_s, env=env, max_output_bytes=max_output_bytes)
        return self._console.script(path, cwd, options, self._snapshot, sealed=self._sealed is not None)

    def _shell(self, command: str, options: ExecOptions) -> ExecResult:
        """:meth:`shell`: the command in the sandbox's persistent bash, as the next line typed into a terminal.

        The shell starts at the first call (in the snapshot's workdir, with ``env``) and keeps its
        working directory, variables and functions between calls until :meth:`restore`,
        :meth:`begin_verification` or :meth:`close`. Commands get ``/dev/null`` on standard input.
        A command that times out ends the shell with everything it started (processes left running
        by earlier commands live on); the next call starts a new shell in the last working
        directory with the last exported variables. See :mod:`pool.backends.local.instance.shellsession`.

        Raises:
            CommandRejectedError: the command holds a NUL byte, is too long, or the timeout is not positive.
            UnsupportedError: the sandbox has no bash (use :meth:`exec`).
            SandboxError: the sandbox is sealed for its verifier.
            SandboxClosedError, SandboxCrashedError: as for :meth:`exec`.
        """
        self._check_open()
        return self._console.step(command, options, self._snapshot, sealed=self._sealed is not None)

    async def shell_async(
        self,
        command: str,
        *,
        timeout_s: float | None = None,
        env: Mapping[str, str] | None = None,
        max_output_bytes: int | None = None,
    ) -> ExecResult:
        """:meth:`shell` on the running asyncio event loop: the step is written to the shell and its
        output read as the loop's selector says the pipes are ready, so no thread waits for it (see
        ``envs.aio``). Same semantics and errors as :meth:`shell`."""
        options = ExecOptions(timeout_s=timeout_s, env=env, max_output_bytes=max_output_bytes)
        self._check_open()
        return await self._console.step_async(command, options, self._snapshot, sealed=self._sealed is not None)

    def memory_exhausted(self) -> bool:
        """True when the sandbox's memory charge is within 10% of its limit: a command that cannot start
        for lack of memory then fails by the agent's doing (its processes, or files on its tmpfs), not the host's."""
        return self._link.memory_exhausted(self._cgroup.limits.memory_bytes)

    def init_died_of_oom(self) -> bool:
        """True when the sandbox's init is gone because its processes used up its memory."""
        return self._link.init_died_of_oom()

    def changes(self, *, max_paths: int = MAX_PATHS) -> Changes:
        """The paths added, changed and removed since the sandbox started, read on the host from
        its writable layer (see pool.backends.local.store.changes); nothing runs in the sandbox."""
        self._check_open()
        return read_changes(
            self.upper_dir,
            self._runtime.layer_paths(self.start_snapshot.layers),
            rootless=self._settings.rootless,
            max_paths=max_paths,
        )

    # -- files --------------------------------------------------------------

    def read_file(self, path: str, *, max_bytes: int | None = None, follow_symlinks: bool = True) -> bytes:
        """The bytes of a regular file inside the sandbox, read through the daemon, or from the writable
        layer in a strict verifier's private folders (the arguments and errors are
        :meth:`Sandbox.read_file <pool.contract.Sandbox.read_file>`'s)."""
        self._check_open()
        resolved = commands.resolve(self._snapshot.workdir, path)
        if any(resolved.startswith(d + "/") for d in self._private):  # a strict verifier's: no process needed
            data = upperread.read(self.upper_dir, resolved, max_bytes)
            if data is not None:
                return data
        return self._link.read_file(resolved, path, max_bytes=max_bytes, follow_symlinks=follow_symlinks)

    def write_file(self, path: str, data: str | bytes, *, mode: int | None = None) -> None:
        """Write a file inside the sandbox, creating parent directories.

        Raises:
            FileOperationError: the path cannot be written; ``.errno`` says why.
        """
        self._check_open()
        content = data.encode() if isinstance(data, str) else bytes(data)
        self._link.write_file(commands.resolve(self._snapshot.workdir, path), path, content, mode=mode)

    # -- lifecycle ----------------------------------------------------------

    def snapshot(self) -> Snapshot:
        """Freeze the current files into an immutable Snapshot (processes are not kept)."""
        self._check_open()
        if self._sealed is not None:
            raise SandboxError("the sandbox is sealed for its verifier; restore() it before taking a snapshot")
        return self._take_snapshot(None)

    def snapshot_of_build(self, build: BuildResult) -> Snapshot:
        """The end of a build: the files as the snapshot of ``build.template`` (see LocalBackend.build)."""
        self._check_open()
        return self._take_snapshot(build)

    def _take_snapshot(self, build: BuildResult | None) -> Snapshot:
        return checkpoint.take(
            self._runtime,
            sandbox_id=self.id,
            parent=self._snapshot,
            upper=self.upper_dir,
            pause=self.freeze,
            resume=self.thaw,
            build=build,
        )

    def restore(self, snapshot: Snapshot | None = None) -> None:
        """Kill every process and go back to ``snapshot`` (default: the last start).

        Nothing of the snapshot is copied: the writable layer is discarded and
        fresh namespaces, set up while the last episode ran, start over the same
        read-only layers, in cgroups of their own. Returns once the previous episode's
        init is killed (the kernel kills every process of its PID namespace with it)
        and the new instance has taken over; they finish dying off the request path,
        in namespaces and cgroups the new instance does not share. Ends a verification (see :meth:`begin_verification`).
        """
        self._check_open()
        self._console.hang_up()
        target = snapshot or self._snapshot
        self._sealed, self._private = None, ()
        self._egress.detach()  # before the instance goes: its namespace can then be reused
        self._egress.log()  # the last episode's records go with it
        self._restart(target)
        self._snapshot = target

    def _restart(self, snapshot: Snapshot) -> None:
        """Kill the sandbox's processes and start fresh namespaces at ``snapshot``."""
        self._runtime.check_snapshot(snapshot)
        resources = snapshot.resources
        self.use_limits(self._settings.limits(resources), self._settings.limited_controllers(resources))
        fields = self._runtime.instance_fields(snapshot, network=False, cgroup=self._cgroup)
        self._init_pid = 0
        reply = self._link.request(Op.RESTORE, fields)
        self.stage_path, self._init_pid = reply["stage"], int(reply.get("pid", "0"))
        self._reused = reused_of(reply)

    def begin_verification(self, plan: VerificationPlan) -> VerificationReport:
        """End the agent's turn: from now until restore(), commands run the verifier's way.

        See pool.verification for what ``strict`` and ``shared`` guarantee.

        Raises:
            ConfigError: the plan does not fit this sandbox (it did not start from
                ``plan.known_good`` or a checkpoint of it).
            SandboxError: the sandbox is sealed already, or the verifier could not start.
        """
        self._check_open()
        if self._sealed is not None:
            raise SandboxError("the sandbox is sealed for its verifier already; restore() it first")
        self._console.hang_up()
        graft, delta = self._install_delta(plan) if plan.mode is VerifyMode.TOOLCHAIN else (None, None)
        if plan.mode.is_separate:
            self._egress.detach()  # the agent's instance ends; the verifier's gets its own gate
        else:
            self._egress.seal()  # same namespace: nothing goes out until the verifier's policy is set
        self._init_pid = 0
        reply = self._link.seal(self._runtime.seal_fields(self._snapshot, plan, self._cgroup, graft=graft))
        self.stage_path = reply.get("stage", self.stage_path)
        self._init_pid = int(reply.get("pid", "0"))
        self._sealed = plan.mode
        if plan.mode.is_separate:
            self._private, self._reused = plan.private_dirs, reused_of(reply)
        return seal.parse_report(plan.mode, reply, delta)

    def list_verifier_view(self, roots: Sequence[str], patterns: Sequence[str]) -> dict[str, tuple[str, int]] | None:
        """What ``find`` in a strict verifier's view would list (see pool.contract.ListsVerifierView), walked
        from the host through the verifier's mount namespace (see :mod:`.instance.viewscan`); None unless strict."""
        self._check_open()
        if self._sealed is not VerifyMode.STRICT:
            return None  # shared: the verifier's view is not the init's; toolchain: find, as before
        pid = self._link.running_init(self._init_pid, self.keeper_pid)
        return viewscan.scan(pid, roots, patterns) if pid > 0 else None

    def _install_delta(self, plan: VerificationPlan) -> tuple[Path | None, InstallDelta]:
        """A toolchain verifier's graft of the agent's installs (see seal.graft_installs)."""
        upper = self.upper_dir
        return self._runtime.graft_installs(self._snapshot, plan, upper, pause=self.freeze, resume=self.thaw)

    # -- network ----------------------------------------------------------

    def set_network(self, policy: NetworkPolicy, *, phase: Phase) -> dict[str, str]:
        """Until restore(), reach only what ``policy`` allows, through the backend's egress proxy.

        The proxy listens at 127.0.0.1:3128 inside the sandbox's network namespace
        (see pool.egress); every command gets ``HTTP_PROXY`` and friends pointing there.

        Raises:
            UnsupportedError: a rootless backend and a policy other than no-network.
            SandboxCrashedError: the sandbox is not running.
        """
        self._check_open()
        return setnetwork.set_network(
            self, policy, phase, egress=self._runtime.egress, gatekeeper=self._egress, netns_pid=self._netns_pid
        )

    def network_log(self) -> NetworkLog:
        """The connection attempts since the last call or restore (see pool.network.audit)."""
        return self._egress.log()

    def _netns_pid(self) -> int:
        pid = self._link.running_init(self._init_pid, self.keeper_pid)
        if pid <= 0:
            raise SandboxCrashedError(f"sandbox {self.id} is not running; restore() it first")
        return pid

    @property
    def sealed(self) -> VerifyMode | None:
        """The verification mode in force since begin_verification(), or None."""
        return self._sealed

    def freeze(self) -> None:
        """Stop every process of the sandbox (SIGSTOP) until thaw()."""
        self._check_open()
        self._link.signal_all(Op.FREEZE)

    def thaw(self) -> None:
        """Let the processes stopped by freeze() run again."""
        self._check_open()
        self._link.signal_all(Op.THAW)

    def close(self) -> None:
        """Kill the sandbox and free its writable layer and cgroup. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._console.hang_up()
        self._egress.detach()
        self._forget(self.number)
        if self._runtime.daemon_is_alive:
            self._link.request(Op.CLOSE, [])
        self._cgroup.remove()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<LocalSandbox {self.id} {state} snapshot={self._snapshot.id[:12]}>"
