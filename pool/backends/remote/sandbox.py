"""One sandbox of a cloud backend: a provider sandbox at a time, handed over at each restore.

A provider sandbox cannot go back in time in place, so ``restore()`` kills the
episode's sandbox at the provider (every process of it goes with its machine),
hands over a spare already created from the target snapshot (``prewarm``), and
creates the next spare in the background; the caller waits for a hand-off, not
a cloud create. A spare's start digest is checked before it is handed over.

Commands run as root with ``/bin/sh -c`` under ``timeout -s KILL`` (see
:data:`WRAPPER`); standard input travels as a file; the provider returns at most
the output cap of each stream.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import errno
import posixpath
import shlex
import time
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

from pool.backends.remote import verify
from pool.backends.remote.link import Link, Started
from pool.backends.remote.provider import RawResult
from pool.basesandbox import BaseSandbox, ExecOptions
from pool.changes import MAX_PATHS, Changes
from pool.errors import (
    CommandRejectedError,
    FileOperationError,
    SandboxCrashedError,
    SandboxEndedError,
    UnsupportedError,
)
from pool.network.audit import NetworkLog
from pool.network.policy import NetworkPolicy, Phase
from pool.results import ExecResult
from pool.snapshots import Snapshot
from pool.verification import VerificationPlan, VerificationReport, VerifyMode

MAX_COMMAND_BYTES = 128 << 10
_STDIN_DIR = "/tmp/.snapgym-stdin"
_MARK = "SNAPGYM_EXEC_MARK"
WRAPPER = (
    "exec 3< {stdin} && case {stdin} in /dev/null) ;; *) rm -f {stdin} ;; esac || exit 126\n"
    + _MARK
    + "={mark} timeout -s KILL {timeout} /bin/sh -c {command} <&3 3<&-; status=$?\n"
    "if [ $status -eq 137 ]; then for p in /proc/[0-9]*; do "
    "while IFS= read -r -d '' entry; do [ \"$entry\" = " + _MARK + "={mark} ] && {{ kill -9 ${{p#/proc/}}; break; }}; "
    "done 2>/dev/null < $p/environ; done; fi\n"
    "exit $status"
)
"""How a command runs (by bash, as every provider runs it): under ``timeout``, its processes marked in
their environment, so that on a timeout every process it started (``setsid`` ones included) is killed.
A process that clears its own environment escapes the mark and lives until the next restore, which
ends the whole sandbox. Nothing but shell builtins runs after the command, so a process the command
left behind to stop, trace or kill every new process cannot keep the step from returning."""


class RemoteSandbox(BaseSandbox):
    """A sandbox whose current state is one provider sandbox."""

    def __init__(self, link: Link, started: Started, snapshot: Snapshot, labels: Mapping[str, str]) -> None:
        """A sandbox whose first provider sandbox is ``started`` (at ``snapshot``); ``link`` is its way to
        the provider, the pace and the backend's threads, with the options it runs with."""
        super().__init__(snapshot)
        self._link = link
        self._provider = link.provider
        self._id = f"{link.name}-{uuid.uuid4().hex[:12]}"
        self._remote: Any | None = started.remote
        self._since_ticks = started.since_ticks
        self._labels = dict(labels)
        self._sealed: VerifyMode | None = None
        self._spare: tuple[str, float, concurrent.futures.Future[Started]] | None = None
        self._prepare_spare(snapshot)

    # -- identity -------------------------------------------------------------

    @property
    def id(self) -> str:
        """snapgym's name for the sandbox (stable across the provider sandboxes it hands over to)."""
        return self._id

    @property
    def remote_id(self) -> str | None:
        """The provider's id of the current state."""
        return None if self._remote is None else self._provider.sandbox_id(self._remote)

    @property
    def labels(self) -> dict[str, str]:
        """The caller's labels and the backend's (every provider sandbox of this one carries them)."""
        return dict(self._labels)

    @property
    def is_alive(self) -> bool:
        """True while the current provider sandbox answers."""
        if self._closed or self._remote is None:
            return False
        try:
            return self._provider.is_running(self._remote)
        except Exception:  # any failure to ask means it does not answer
            return False

    @property
    def sealed(self) -> VerifyMode | None:
        """The verification mode in force since begin_verification(), or None."""
        return self._sealed

    # -- commands -------------------------------------------------------------

    def _exec(self, command: str, options: ExecOptions) -> ExecResult:
        """:meth:`exec` by the provider, under :data:`WRAPPER`; standard input travels as a file."""
        remote = self._live()
        size = len(command.encode())
        if size > MAX_COMMAND_BYTES:
            raise CommandRejectedError(f"command is {size} bytes, over {MAX_COMMAND_BYTES}; pass data with stdin")
        if "\0" in command:
            raise CommandRejectedError("command contains a NUL byte")
        timeout = options.timeout_or(self._link.options.default_timeout_s)
        source = "/dev/null"
        if options.stdin:
            source = f"{_STDIN_DIR}/{uuid.uuid4().hex}"
            self.write_file(source, options.stdin, mode=0o600)
        wrapped = WRAPPER.format(
            mark=uuid.uuid4().hex, timeout=f"{max(timeout, 0.001):.3f}", command=shlex.quote(command), stdin=source
        )
        started = time.monotonic()
        with self._ended_from_inside(remote):
            raw = self._provider.run(
                remote,
                wrapped,
                cwd=options.cwd or self._snapshot.workdir,
                env={**self._snapshot.env, **(options.env or {})},
                timeout_s=timeout + self._link.options.request_timeout_s,
                cap=options.cap_or(self._link.options.max_output_bytes),
            )
        elapsed = time.monotonic() - started
        exit_code = 137 if raw.lost else raw.exit_code
        return ExecResult(
            exit_code=exit_code,
            stdout=raw.stdout,
            stderr=raw.stderr,
            duration_s=elapsed,
            timed_out=raw.lost or (exit_code == 137 and elapsed >= timeout * 0.98),
            stdout_truncated=raw.stdout_truncated,
            stderr_truncated=raw.stderr_truncated,
        )

    def read_file(self, path: str, *, max_bytes: int | None = None, follow_symlinks: bool = True) -> bytes:
        """Bytes of a regular file (``follow_symlinks=False`` refuses a final link)."""
        remote = self._live()
        path = posixpath.join(self._snapshot.workdir, path)
        if not follow_symlinks and self.exec(f"test -L {shlex.quote(path)}", timeout_s=30).ok:
            raise FileOperationError(errno.ELOOP, f"{path} is a symbolic link", path)
        with self._ended_from_inside(remote):
            data = self._provider.read(remote, path)
        if max_bytes is not None and len(data) > max_bytes:
            raise FileOperationError(errno.EFBIG, f"{path} is {len(data)} bytes, over the {max_bytes} asked for", path)
        return data

    def write_file(self, path: str, data: str | bytes, *, mode: int | None = None) -> None:
        """Write a file as root, creating parent directories."""
        remote = self._live()
        path = posixpath.join(self._snapshot.workdir, path)
        with self._ended_from_inside(remote):
            self._provider.write(remote, path, data.encode() if isinstance(data, str) else bytes(data))
        if mode is not None:
            result = self.exec(f"chmod {mode:o} {shlex.quote(path)}", timeout_s=30)
            if not result.ok:
                raise FileOperationError(errno.EPERM, f"chmod {mode:o} {path}: {result.stderr.strip()}", path)

    # -- time -----------------------------------------------------------------

    def snapshot(self) -> Snapshot:
        """Freeze the current state into a provider snapshot and record it."""
        return self._link.snapshot_of(self._live(), parent=self._snapshot)

    def restore(self, snapshot: Snapshot | None = None) -> None:
        """Hand over to a fresh provider sandbox at ``snapshot`` (default: the last start); the old one is killed."""
        self._check_open()
        target = snapshot or self._snapshot
        self._link.check(target)
        old, self._remote = self._remote, None
        if old is not None:
            self._link.kill_later(old)
        self._hand_over(self._take_spare(target) or self._link.start(target, self._labels))
        self._snapshot = target
        self._sealed = None
        self._prepare_spare(target)

    def begin_verification(self, plan: VerificationPlan) -> VerificationReport:
        """End the agent's turn: strict only (see :mod:`pool.backends.remote.verify`); until restore(),
        commands and files are the verifier's, in a fresh provider sandbox at the known-good snapshot.

        Raises:
            UnsupportedError: shared mode.
            SandboxError: the outputs could not be carried (over the size cap, an archive error).
        """
        self._check_open()
        if plan.mode is not VerifyMode.STRICT:
            raise UnsupportedError(
                f"the {self._link.name} backend verifies in strict mode only ({plan.mode.value} mode needs "
                "a list of the agent's changes that the agent cannot forge, which a provider sandbox lacks); "
                "use verification=strict, or the local backend"
            )
        if self._sealed is not None:
            raise UnsupportedError("the verifier's turn has begun already; restore() first")
        known_good = plan.known_good or self._snapshot
        self._link.check(known_good)
        outputs = verify.collect_outputs(self, plan)
        agent, self._remote = self._remote, None
        if agent is not None:
            self._provider.kill(agent)  # the agent's machine, and every process in it, ends first
        self._hand_over(self._take_spare(known_good) or self._link.start(known_good, self._labels))
        self._sealed = VerifyMode.STRICT
        self._prepare_spare(self._snapshot)
        return verify.install(self, plan, outputs)

    def set_network(self, policy: NetworkPolicy, *, phase: Phase) -> dict[str, str]:
        """Until restore(), reach what ``policy`` allows, enforced by the provider's egress controls;
        nothing is recorded of the attempts (``Capabilities.egress_audit`` is False).

        Raises:
            UnsupportedError: a policy the provider cannot express (the message says which part).
        """
        self._provider.set_network(self._live(), policy)
        return {}

    def _shell(self, command: str, options: ExecOptions) -> ExecResult:
        """Not available here (``Capabilities.shell_session`` is False): every command is an exec()."""
        raise UnsupportedError(f"{self._link.name}: no persistent shell session; run commands with exec()")

    def changes(self, *, max_paths: int = MAX_PATHS) -> Changes:
        """Not available: only a command in the sandbox could list them, and the agent could forge
        that (``Capabilities.changes`` is "none").

        Raises:
            UnsupportedError: always.
        """
        raise UnsupportedError(
            f"{self._link.name}: no end-state diff the agent could not forge (the provider lists no "
            "changes outside the sandbox); capabilities.changes is 'none'"
        )

    def network_log(self) -> NetworkLog:
        """Empty: the providers do not report connection attempts."""
        return NetworkLog()

    def close(self) -> None:
        """Kill the current provider sandbox and the spare. Idempotent."""
        if self._closed:
            return
        self._closed = True
        remote, self._remote = self._remote, None
        if remote is not None:
            self._link.kill_later(remote)
        self._drop_spare()
        self._link.forget(self._id)

    # -- spares ---------------------------------------------------------------

    def _prepare_spare(self, snapshot: Snapshot) -> None:
        if not self._link.options.prewarm or self._closed:
            return
        self._drop_spare()
        self._spare = (snapshot.id, time.monotonic(), self._link.start_later(snapshot, self._labels))

    def _take_spare(self, snapshot: Snapshot) -> Started | None:
        """The spare, when it is of ``snapshot`` and young enough: a spare that waited through most of
        its provider lifetime (``spare_max_age_s``) would end under the episode, so it is replaced."""
        spare, self._spare = self._spare, None
        if spare is None:
            return None
        snapshot_id, made_at, future = spare
        if snapshot_id != snapshot.id or time.monotonic() - made_at > self._link.spare_max_age_s:
            self._discard(future)
            return None
        try:
            return future.result()
        except Exception:  # a failed spare is replaced by a create on the spot
            return None

    def _drop_spare(self) -> None:
        spare, self._spare = self._spare, None
        if spare is not None:
            self._discard(spare[2])

    def _discard(self, future: concurrent.futures.Future[Started]) -> None:
        def kill(done: concurrent.futures.Future[Started]) -> None:
            with contextlib.suppress(Exception):
                self._link.kill_later(done.result().remote)

        future.add_done_callback(kill)

    # -- helpers --------------------------------------------------------------

    def run_direct(self, command: str, *, timeout_s: float, cwd: str = "/") -> RawResult:
        """Run ``command`` as the backend's own step: no wrapper, the snapshot's environment, the
        provider's own timeout (a process the agent stopped cannot stretch it), a 64 KiB output cap."""
        remote = self._live()
        with self._ended_from_inside(remote):
            return self._provider.run(remote, command, cwd=cwd, env=self._snapshot.env, timeout_s=timeout_s,
                                      cap=64 << 10)  # fmt: skip

    @property
    def since_ticks(self) -> int:
        """When the current provider sandbox was handed over (see :class:`~pool.backends.remote.link.Started`)."""
        return self._since_ticks

    def _hand_over(self, started: Started) -> None:
        self._remote, self._since_ticks = started.remote, started.since_ticks

    @contextlib.contextmanager
    def _ended_from_inside(self, remote: Any) -> Iterator[None]:
        """A provider sandbox that is gone because its own processes ended it raises
        :class:`~pool.errors.SandboxEndedError` (the agent's doing), not a crash (the provider's)."""
        try:
            yield
        except SandboxCrashedError as exc:
            try:
                how = self._provider.ended_from_inside(remote)
            except Exception:  # asking failed: the provider's, as the crash says
                how = None
            if how is None:
                raise
            raise SandboxEndedError(f"sandbox {self._id}: its own processes ended it ({how})") from exc

    def _live(self) -> Any:
        self._check_open()
        if self._remote is None:
            raise SandboxCrashedError(f"sandbox {self._id} has no provider sandbox; restore() it")
        return self._remote
