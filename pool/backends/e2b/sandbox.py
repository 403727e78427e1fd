"""One sandbox of the E2B backend: an E2B sandbox at a time, handed over at each restore.

An E2B sandbox cannot go back in time in place, so ``restore()`` kills the
episode's sandbox (every process of it goes with its microVM), hands over a
spare already created from the target snapshot (``prewarm``), and creates the
next spare in the background; the caller waits for a hand-off, not a cloud
create. A spare's start digest is checked before it is handed over.

Commands run as root with ``/bin/sh -c`` under ``timeout -s KILL`` (see :data:`_WRAPPER`); output is
consumed as it streams and capped, so a command that prints gigabytes costs
the client no memory. Standard input travels as a file.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import errno
import posixpath
import shlex
import time
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import e2b

from pool.backends.e2b import verify
from pool.backends.e2b.errors import provider_errors
from pool.backends.e2b.network import provider_network
from pool.egress.audit import NetworkLog
from pool.egress.policy import NetworkPolicy, Phase
from pool.errors import (
    CommandRejectedError,
    FileOperationError,
    SandboxClosedError,
    SandboxCrashedError,
    UnsupportedError,
)
from pool.results import ExecResult
from pool.snapshots import Snapshot
from pool.verification import VerificationPlan, VerificationReport, VerifyMode

if TYPE_CHECKING:
    from pool.backends.e2b.backend import E2BBackend

ROOT = "root"
"""Every command and file operation runs as the sandbox's root, as on the other backends."""
MAX_COMMAND_BYTES = 128 << 10
_STDIN_DIR = "/tmp/.snapgym-stdin"
_MARK = "SNAPGYM_EXEC_MARK"
_WRAPPER = (
    _MARK + "={mark} timeout -s KILL {timeout} /bin/sh -c {command} < {stdin}; status=$?\n"
    "if [ $status -eq 137 ]; then for p in /proc/[0-9]*; do "
    "tr '\\0' '\\n' < $p/environ 2>/dev/null | grep -qx " + _MARK + "={mark} && kill -9 ${{p#/proc/}} 2>/dev/null; "
    "done; fi\n"
    "case {stdin} in /dev/null) ;; *) rm -f {stdin} ;; esac\n"
    "exit $status"
)
"""How a command runs: under ``timeout``, its processes marked in their environment, so that on a
timeout every process it started (``setsid`` ones included) is killed. A process that clears its
own environment escapes the mark and lives until the next restore, which ends the whole sandbox."""


class _Capped:
    """Collects a stream's text up to a byte cap, dropping the rest."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.parts: list[bytes] = []
        self.size = 0
        self.truncated = False

    def __call__(self, text: str) -> None:
        data = text.encode("utf-8", "surrogateescape")
        room = self.cap - self.size
        if len(data) > room:
            self.truncated = True
            data = data[: max(room, 0)]
        if data:
            self.parts.append(data)
            self.size += len(data)

    def text(self) -> str:
        return b"".join(self.parts).decode("utf-8", "replace")


class E2BSandbox:
    """A sandbox whose current state is one E2B sandbox."""

    def __init__(self, backend: E2BBackend, remote: e2b.Sandbox, snapshot: Snapshot, labels: Mapping[str, str]) -> None:
        self._backend = backend
        self._id = f"e2b-{uuid.uuid4().hex[:12]}"
        self._remote: e2b.Sandbox | None = remote
        self._snapshot = snapshot
        self._labels = dict(labels)
        self._closed = False
        self._sealed: VerifyMode | None = None
        self._spare: tuple[str, concurrent.futures.Future[e2b.Sandbox]] | None = None
        self._prepare_spare(snapshot)

    # -- identity -------------------------------------------------------------

    @property
    def id(self) -> str:
        """snapgym's name for the sandbox (stable across the E2B sandboxes it hands over to)."""
        return self._id

    @property
    def remote_id(self) -> str | None:
        """The E2B sandbox id of the current state."""
        return None if self._remote is None else str(self._remote.sandbox_id)

    @property
    def labels(self) -> dict[str, str]:
        """The caller's labels and the backend's (every E2B sandbox of this one carries them as metadata)."""
        return dict(self._labels)

    @property
    def start_snapshot(self) -> Snapshot:
        """The snapshot this sandbox last started from."""
        return self._snapshot

    @property
    def start_digest(self) -> str:
        """The digest of that snapshot (checked inside each E2B sandbox before it is used)."""
        return self._snapshot.digest

    @property
    def is_closed(self) -> bool:
        """True after close()."""
        return self._closed

    @property
    def is_alive(self) -> bool:
        """True while the current E2B sandbox runs."""
        if self._closed or self._remote is None:
            return False
        try:
            return bool(self._remote.is_running())
        except Exception:  # any failure to ask means it does not answer
            return False

    # -- commands -------------------------------------------------------------

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
        """Run ``command`` with ``/bin/sh -c`` as root; a non-zero exit or a timeout is data.

        Args:
            command: shell source; at most 128 KiB (pass data with ``stdin``).
            timeout_s: kill the command after this long (default: the backend's ``default_timeout_s``);
                exit 137 and ``timed_out``. Processes it left in the background live until restore.
            cwd: working directory (default: the snapshot's workdir).
            env: variables added to the snapshot's environment.
            stdin: data on standard input (default: empty).
            max_output_bytes: cap per stream (default: the backend's).
        """
        remote = self._live()
        if len(command.encode()) > MAX_COMMAND_BYTES:
            raise CommandRejectedError(
                f"command is {len(command.encode())} bytes, over {MAX_COMMAND_BYTES}; pass data with stdin"
            )
        if "\0" in command:
            raise CommandRejectedError("command contains a NUL byte")
        timeout = timeout_s if timeout_s is not None else self._backend.default_timeout_s
        cap = max_output_bytes if max_output_bytes is not None else self._backend.max_output_bytes
        source = "/dev/null"
        if stdin:
            source = f"{_STDIN_DIR}/{uuid.uuid4().hex}"
            self.write_file(source, stdin, mode=0o600)
        wrapped = _WRAPPER.format(
            mark=uuid.uuid4().hex, timeout=f"{max(timeout, 0.001):.3f}", command=shlex.quote(command), stdin=source
        )
        out, err = _Capped(cap), _Capped(cap)
        started = time.monotonic()
        exit_code = 0
        with provider_errors("running a command"):
            try:
                result = remote.commands.run(
                    wrapped,
                    envs={**self._snapshot.env, **(env or {})},
                    user=ROOT,
                    cwd=cwd or self._snapshot.workdir,
                    on_stdout=out,
                    on_stderr=err,
                    timeout=timeout + self._backend.request_timeout_s,
                    retain_output=False,
                )
                exit_code = int(result.exit_code)
            except e2b.CommandExitException as exc:
                exit_code = int(exc.exit_code)
            except e2b.TimeoutException as exc:
                if isinstance(exc, (e2b.SandboxNotRunningException, e2b.SandboxUnreachableException)):
                    raise
                exit_code = 137
        elapsed = time.monotonic() - started
        timed_out = exit_code == 137 and elapsed >= timeout * 0.98
        return ExecResult(
            exit_code=exit_code,
            stdout=out.text(),
            stderr=err.text(),
            duration_s=elapsed,
            timed_out=timed_out,
            stdout_truncated=out.truncated,
            stderr_truncated=err.truncated,
        )

    def read_file(self, path: str, *, max_bytes: int | None = None, follow_symlinks: bool = True) -> bytes:
        """Bytes of a regular file (``follow_symlinks=False`` refuses a final link)."""
        remote = self._live()
        path = posixpath.join(self._snapshot.workdir, path)
        if not follow_symlinks and self.exec(f"test -L {shlex.quote(path)}", timeout_s=30).ok:
            raise FileOperationError(errno.ELOOP, f"{path} is a symbolic link", path)
        with provider_errors(f"reading {path}", file_operation=True):
            data = bytes(remote.files.read(path, format="bytes", user=ROOT))
        if max_bytes is not None and len(data) > max_bytes:
            raise FileOperationError(errno.EFBIG, f"{path} is {len(data)} bytes, over the {max_bytes} asked for", path)
        return data

    def write_file(self, path: str, data: str | bytes, *, mode: int | None = None) -> None:
        """Write a file as root, creating parent directories."""
        remote = self._live()
        path = posixpath.join(self._snapshot.workdir, path)
        folder = posixpath.dirname(path)
        payload = data.encode() if isinstance(data, str) else bytes(data)
        with provider_errors(f"writing {path}", file_operation=True):
            remote.files.make_dir(folder, user=ROOT)
            remote.files.write(path, payload, user=ROOT)
        if mode is not None:
            result = self.exec(f"chmod {mode:o} {shlex.quote(path)}", timeout_s=30)
            if not result.ok:
                raise FileOperationError(errno.EPERM, f"chmod {mode:o} {path}: {result.stderr.strip()}", path)

    # -- time -----------------------------------------------------------------

    def snapshot(self) -> Snapshot:
        """Freeze the current state into an E2B snapshot (memory and files) and record it."""
        return self._backend.snapshot_of(self._live(), parent=self._snapshot)

    def restore(self, snapshot: Snapshot | None = None) -> None:
        """Hand over to a fresh E2B sandbox at ``snapshot`` (default: the last start); the old one is killed."""
        self._check_open()
        target = snapshot or self._snapshot
        self._backend.check_snapshot(target)
        old, self._remote = self._remote, None
        if old is not None:
            self._backend.kill_later(old)
        self._remote = self._take_spare(target) or self._backend.start(target, self._labels)
        self._snapshot = target
        self._sealed = None
        self._prepare_spare(target)

    def begin_verification(self, plan: VerificationPlan) -> VerificationReport:
        """End the agent's turn: strict only (see :mod:`pool.backends.e2b.verify`); until restore(),
        commands and files are the verifier's, in a fresh E2B sandbox at the known-good snapshot.

        Raises:
            UnsupportedError: shared mode.
            SandboxError: the outputs could not be carried (over the size cap, an archive error).
        """
        self._check_open()
        if plan.mode is not VerifyMode.STRICT:
            raise UnsupportedError("the e2b backend verifies in strict mode only (Capabilities.verification)")
        if self._sealed is not None:
            raise UnsupportedError("the verifier's turn has begun already; restore() first")
        known_good = plan.known_good or self._snapshot
        self._backend.check_snapshot(known_good)
        archive, carried, missing = verify.collect_outputs(self, plan)
        agent, self._remote = self._remote, None
        if agent is not None:
            self._backend.kill_now(agent)  # the agent's microVM, and every process in it, ends first
        self._remote = self._take_spare(known_good) or self._backend.start(known_good, self._labels)
        self._sealed = VerifyMode.STRICT
        self._prepare_spare(self._snapshot)
        return verify.install(self, plan, archive, carried, missing)

    @property
    def sealed(self) -> VerifyMode | None:
        """The verification mode in force since begin_verification(), or None."""
        return self._sealed

    def set_network(self, policy: NetworkPolicy, *, phase: Phase) -> dict[str, str]:
        """Until restore(), reach what ``policy`` allows, enforced by E2B's egress filter
        (:mod:`pool.backends.e2b.network`); nothing is recorded of the attempts.

        Raises:
            UnsupportedError: an allowlist entry with a port (E2B filters by destination only).
        """
        remote = self._live()
        body = provider_network(policy)
        with provider_errors(f"setting the {phase.value} phase's network"):
            remote.update_network(body)
        return {}

    def network_log(self) -> NetworkLog:
        """Empty: E2B does not report connection attempts (``Capabilities.egress_audit`` is False)."""
        return NetworkLog()

    def close(self) -> None:
        """Kill the current E2B sandbox and the spare. Idempotent."""
        if self._closed:
            return
        self._closed = True
        remote, self._remote = self._remote, None
        if remote is not None:
            self._backend.kill_later(remote)
        self._drop_spare()
        self._backend.forget(self)

    def __enter__(self) -> E2BSandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- spares ---------------------------------------------------------------

    def _prepare_spare(self, snapshot: Snapshot) -> None:
        if not self._backend.prewarm or self._closed:
            return
        self._drop_spare()
        self._spare = (snapshot.id, self._backend.start_later(snapshot, self._labels))

    def _take_spare(self, snapshot: Snapshot) -> e2b.Sandbox | None:
        spare, self._spare = self._spare, None
        if spare is None:
            return None
        snapshot_id, future = spare
        if snapshot_id != snapshot.id:
            self._discard(future)
            return None
        try:
            return future.result()
        except Exception:  # a failed spare is replaced by a create on the spot
            return None

    def _drop_spare(self) -> None:
        spare, self._spare = self._spare, None
        if spare is not None:
            self._discard(spare[1])

    def _discard(self, future: concurrent.futures.Future[e2b.Sandbox]) -> None:
        def kill(done: concurrent.futures.Future[e2b.Sandbox]) -> None:
            with contextlib.suppress(Exception):
                self._backend.kill_later(done.result())

        future.add_done_callback(kill)

    # -- helpers --------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise SandboxClosedError(f"sandbox {self._id} is closed")

    def _live(self) -> Any:
        self._check_open()
        if self._remote is None:
            raise SandboxCrashedError(f"sandbox {self._id} has no E2B sandbox; restore() it")
        return self._remote
