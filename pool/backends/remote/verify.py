"""A cloud backend's side of ``sandbox.begin_verification``: strict mode (see :mod:`pool.verification`).

Collecting the outputs, in the agent's sandbox, as the backend's own steps (no
wrapper, the provider's own timeouts). First every process of the episode is
killed: each one started after the sandbox was handed over (its start time in
``/proc``, which a process cannot change) or carrying the mark of an agent's
command in its environment, except the collector's own ancestors (the
provider's exec chain), sweep after sweep until a sweep finds none. So nothing
the agent left running can stop, trace or race the archiving. Then the
outputs that are folders are archived with ``tar`` and read out. Each of
these steps must end with a line that is new for each verification: an exit
status of 0 is not enough, since a process left running can trace the step's
shell into another program. A sandbox
that does not give up its outputs (its disk full, its PIDs held, its ``tar``
broken, a collector stopped past its timeout) while the provider says it is
running is the agent's doing: the verifier sees the outputs empty and the
result says why, scored, never an infrastructure error the agent could use to
hide a failure. So is a sandbox its own processes ended (the provider says
its entrypoint exited: :class:`~pool.errors.SandboxEndedError`). A provider
that does not answer, or ended the sandbox itself, is an infrastructure error.

Then that sandbox is killed at the provider (its machine, and every process
the agent started, ends before anything of the verifier's runs), and the
verifier gets a fresh sandbox at the known-good snapshot (the spare, when that
is the one). Into it go the outputs, extracted by the verifier's own ``tar``
(the known-good one: an archive made by a ``tar`` the agent replaced cannot
write outside the outputs, through ``..`` or through links it plants, because
the extraction is limited to the output members and GNU tar defers links until
the end; an archive it cannot extract leaves the outputs empty, as above), the
task's tests at ``/tests``, and fresh private folders. Then every link in the
outputs that leads (as the kernel resolves it) into ``/tests``, a private
folder or its top-level folder, ``/proc`` or ``/sys`` is removed and
reported: the same audit as the local and Docker backends' (see
``_remove_escaping_links``).

Shared mode (the verifier beside the agent's live processes) is not offered:
nothing inside one provider sandbox would keep them from the reward.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import posixpath
import shlex
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Protocol

from pool.backends.remote.provider import RawResult
from pool.errors import BackendError, FileOperationError, SandboxCrashedError, SandboxEndedError, SandboxError
from pool.results import ExecResult
from pool.verification import (
    MAX_LINK_HOPS,
    VerificationPlan,
    VerificationReport,
    VerifyMode,
    leads_into,
    outermost,
    protected_tops,
)

MAX_OUTPUTS_BYTES = 512 << 20
"""The largest archive of outputs carried to the verifier."""
STOP_TIMEOUT_S = 8.0
"""How long killing the episode's processes may take (a collector the agent stopped ends then)."""
ARCHIVE_TIMEOUT_S = 600.0
_ARCHIVE_DIR = "/tmp/.snapgym-verify"
_STOP_EPISODE = r"""since={since}
keep=" 1 "; read -r line < /proc/self/stat; p=${{line%% *}}
while [ "$p" -gt 1 ] 2>/dev/null; do
  keep="$keep$p "; read -r line < /proc/$p/stat || break; set -- ${{line##*) }}; p=$2
done
round=0
while [ $round -lt 100 ]; do
  round=$((round + 1)); found=0
  for dir in /proc/[0-9]*; do
    pid=${{dir#/proc/}}
    case "$keep" in *" $pid "*) continue ;; esac
    read -r line < "$dir/stat" 2>/dev/null || continue
    set -- ${{line##*) }}
    [ "$1" = Z ] && continue
    if [ "${{20}}" -ge "$since" ] || grep -qas SNAPGYM_EXEC_MARK= "$dir/environ"; then
      kill -9 "$pid" 2>/dev/null && found=1
    fi
  done
  [ $found = 0 ] && {{ echo "{done}"; exit 0; }}
done
echo "processes kept appearing after $round sweeps" >&2
exit 3"""
"""Kills every process of the episode (see the module docstring); ``{since}``: the hand-over time, ``{done}``:
the line it ends with when no process of the episode is left."""
_ARCHIVE = """mkdir -p {folder} || exit 1
set --
for out in {outputs}; do
  if [ -d "$out" ] && [ ! -L "$out" ]; then set -- "$@" "${{out#/}}"; echo "carried $out"; fi
done
[ $# -gt 0 ] || {{ echo "{done}"; exit 0; }}
tar -C / -cf {archive} "$@"; status=$?
[ $status -le 1 ] || exit $status
echo "size $(stat -c %s {archive})"
echo "{done}"
"""
"""Archives the outputs that are folders (not links); GNU tar's 1 (a file changed as it was read) is no failure.
``{done}``: the line it ends with."""


class VerifiedSandbox(Protocol):
    """What verification uses of a cloud sandbox (:class:`~pool.backends.remote.sandbox.RemoteSandbox`)."""

    @property
    def is_alive(self) -> bool:
        """True while the current provider sandbox answers."""

    @property
    def since_ticks(self) -> int:
        """When the current provider sandbox was handed over, in its clock ticks since boot."""

    def run_direct(self, command: str, *, timeout_s: float, cwd: str = "/") -> RawResult:
        """Run ``command`` as the backend's own step (no wrapper, the provider's own timeout)."""

    def exec(self, command: str, *, timeout_s: float | None = None, cwd: str | None = None) -> ExecResult:
        """Run ``command`` as root; a non-zero exit is data."""

    def read_file(self, path: str) -> bytes:
        """Bytes of a regular file."""

    def write_file(self, path: str, data: str | bytes, *, mode: int | None = None) -> None:
        """Write a file as root, creating parent directories."""


@dataclasses.dataclass(frozen=True, slots=True)
class Outputs:
    """What was carried out of the agent's sandbox."""

    archive: bytes
    carried: tuple[str, ...]
    """The outputs in the archive (folders at the end of the episode)."""
    missing: tuple[str, ...]
    """The outputs the verifier sees empty."""
    notes: tuple[str, ...] = ()


def collect_outputs(sandbox: VerifiedSandbox, plan: VerificationPlan) -> Outputs:
    """In the agent's sandbox: stop the episode's processes, then archive the outputs that are folders."""
    outputs = outermost(plan.outputs)
    cause: Exception | None = None
    try:
        collected = _collect(sandbox, outputs)
    except (SandboxError, BackendError) as exc:
        collected, cause = f"{type(exc).__name__}: {exc}", exc
    if isinstance(collected, Outputs):
        return collected
    if isinstance(cause, SandboxEndedError):  # the agent's processes ended it: theirs to answer for
        note = f"the agent's sandbox ended before its outputs were collected, so the verifier sees them empty: {cause}"
        return Outputs(b"", (), outputs, (note,))
    if not sandbox.is_alive:  # the provider ended it, or does not answer: not the agent's doing
        raise SandboxCrashedError(
            f"the agent's sandbox ended before its outputs were collected ({collected})"
        ) from cause
    note = f"the agent's sandbox did not give up its outputs, so the verifier sees them empty: {collected}"
    return Outputs(b"", (), outputs, (note,))


def _collect(sandbox: VerifiedSandbox, outputs: tuple[str, ...]) -> Outputs | str:
    """The outputs, or why the sandbox did not give them up."""
    done = f"snapgym-step-done-{uuid.uuid4().hex}"
    stopped = sandbox.run_direct(_STOP_EPISODE.format(since=sandbox.since_ticks, done=done), timeout_s=STOP_TIMEOUT_S)
    if stopped.lost or stopped.exit_code != 0 or not _ended(stopped, done):
        return f"the episode's processes could not be stopped ({_why(stopped, done)})"
    archive = f"{_ARCHIVE_DIR}/{uuid.uuid4().hex}.tar"
    quoted = " ".join(shlex.quote(out) for out in outputs)
    script = _ARCHIVE.format(folder=_ARCHIVE_DIR, outputs=quoted, archive=archive, done=done)
    made = sandbox.run_direct(script, timeout_s=ARCHIVE_TIMEOUT_S)
    if made.lost or made.exit_code != 0 or not _ended(made, done):
        return f"archiving them failed ({_why(made, done)})"
    lines = made.stdout.splitlines()
    carried = tuple(line[len("carried ") :] for line in lines if line.startswith("carried "))
    missing = tuple(out for out in outputs if out not in carried)
    if not carried:
        return Outputs(b"", (), missing)
    size = next((line[len("size ") :] for line in lines if line.startswith("size ")), "")
    if not size.isdigit():
        return f"the archive's size is unknown ({_why(made)})"
    if int(size) > MAX_OUTPUTS_BYTES:
        return (
            f"the archive is {int(size) >> 20} MiB, over the {MAX_OUTPUTS_BYTES >> 20} MiB a strict verification "
            "on a cloud backend carries"
        )
    return Outputs(sandbox.read_file(archive), carried, missing)


def install(sandbox: VerifiedSandbox, plan: VerificationPlan, outputs: Outputs) -> VerificationReport:
    """In the verifier's fresh sandbox: the outputs, the tests, fresh private folders, and the link audit."""
    private = (plan.tests_path, *plan.private_dirs)
    fresh = " ".join(shlex.quote(path) for path in (*outermost(plan.outputs), *private))
    _run(sandbox, f"rm -rf {fresh} && mkdir -p {fresh}", "preparing the verifier's folders")
    carried, missing, notes = outputs.carried, outputs.missing, outputs.notes
    if outputs.archive:
        path = f"{_ARCHIVE_DIR}/{uuid.uuid4().hex}.tar"
        sandbox.write_file(path, outputs.archive, mode=0o600)
        members = " ".join(shlex.quote(out.lstrip("/")) for out in carried)
        unpacked = sandbox.exec(f"tar -C / -xpf {path} {members}; status=$?; rm -f {path}; exit $status",
                                timeout_s=ARCHIVE_TIMEOUT_S, cwd="/")  # fmt: skip
        if not unpacked.ok:  # the agent's archive: its outputs, empty
            _run(sandbox, f"rm -rf {fresh} && mkdir -p {fresh}", "emptying the outputs")
            notes = (*notes, f"the outputs' archive could not be unpacked: {unpacked.stderr[-300:].strip()}")
            carried, missing = (), outermost(plan.outputs)
    _put_tests(sandbox, plan)
    removed = _remove_escaping_links(sandbox, carried, plan)
    return VerificationReport(
        VerifyMode.STRICT, removed_links=removed, missing_outputs=tuple(missing), notes=tuple(notes)
    )


def _ended(result: RawResult, done: str) -> bool:
    """True if a collector's step ran to its end: its last line is ``done``.

    An exit status of 0 alone proves nothing: a process the agent left running can trace the
    step's shell and turn it into another program that exits 0 (the ptrace-verifier attack),
    and the processes that should have been stopped would then live on into the next step.
    """
    return result.stdout.rstrip("\n").rsplit("\n", 1)[-1] == done


def _why(result: RawResult, done: str = "") -> str:
    if result.lost:
        return "timed out"
    if done and result.exit_code == 0 and not _ended(result, done):
        return "exit 0 before its last line: it was not the collector's script that ended"
    return f"exit {result.exit_code}: {(result.stderr or result.stdout)[-300:].strip()}"


def _put_tests(sandbox: VerifiedSandbox, plan: VerificationPlan) -> None:
    root = Path(plan.tests_dir)
    if not root.is_dir():
        raise FileOperationError(errno.ENOENT, f"the task's tests folder {root} is missing", str(root))
    for source in sorted(root.rglob("*")):
        if source.is_symlink() or not source.is_file():
            continue
        target = posixpath.join(plan.tests_path, source.relative_to(root).as_posix())
        sandbox.write_file(target, source.read_bytes(), mode=source.stat().st_mode & 0o777)


_LIST_LINKS = (
    "while IFS= read -r -d '' out; do find \"$out\" -type l -print0; done | "
    'while IFS= read -r -d \'\' link; do printf \'%s\\0%s\\0\' "$link" "$(readlink -- "$link")"; done'
)
"""Every link under the given outputs, with its target: ``path\\0target\\0`` each."""
_LOOK_UP = (
    "while IFS= read -r -d '' path; do if [ -L \"$path\" ]; then "
    'printf \'%s\\0%s\\0\' "$path" "$(readlink -- "$path")"; else printf \'%s\\0\\0\' "$path"; fi; done'
)
"""For each given path: ``path\\0target\\0`` (an empty target: no link there)."""
_REMOVE = "while IFS= read -r -d '' link; do rm -f -- \"$link\" || exit 1; done"
_MAX_ROUNDS = 2 * MAX_LINK_HOPS + 2


def _remove_escaping_links(
    sandbox: VerifiedSandbox, outputs: tuple[str, ...], plan: VerificationPlan
) -> tuple[str, ...]:
    """The link audit of the local and Docker backends, for a sandbox that cannot run their C.

    A provider's sandbox may be of any architecture and need not hold a C library, so the
    resolution runs here (:func:`pool.verification.leads_into`, the same semantics as
    ``pool/backends/csrc/linkaudit.c``) over what a few shell commands in the sandbox say:
    the links in the outputs first, then, round by round, whether the paths the links pass
    through are links. Every link is judged before any is removed (a chain judged as left).
    """
    if not outputs:
        return ()
    found = _pairs(_bash(sandbox, _LIST_LINKS, outputs, "listing the links in the outputs"))
    known: dict[str, str | None] = dict(found)
    protected = protected_tops(plan)
    verdicts: dict[str, bool] = {}
    for _ in range(_MAX_ROUNDS):
        wanted: set[str] = set()
        for link, target in found:
            if link not in verdicts:
                answer = leads_into(link, target, protected, known)
                if isinstance(answer, bool):
                    verdicts[link] = answer
                else:
                    wanted.update(answer)
        if not wanted:
            break
        looked = _bash(sandbox, _LOOK_UP, sorted(wanted), "resolving the links in the outputs")
        known.update((path, target or None) for path, target in _pairs(looked))
        known.update((path, None) for path in wanted if path not in known)
    doomed = [(link, target) for link, target in found if verdicts.get(link, True)]  # unresolved: removed
    if doomed:
        _bash(sandbox, _REMOVE, [link for link, _ in doomed], "removing links into the verifier's paths")
    return tuple(f"{link} -> {target}" for link, target in doomed)


def _pairs(output: str) -> list[tuple[str, str]]:
    fields = output.split("\0")
    return [(fields[i], fields[i + 1]) for i in range(0, len(fields) - 1, 2)]


def _bash(sandbox: VerifiedSandbox, script: str, paths: Iterable[str], what: str) -> str:
    """Run ``script`` with ``paths`` on its stdin, NUL-separated; its stdout. Both travel as files, byte
    for byte (``os.fsencode``/``os.fsdecode``): a name that is not UTF-8 stays the name it is."""
    stem = f"{_ARCHIVE_DIR}/{uuid.uuid4().hex}"
    sandbox.write_file(f"{stem}.in", b"".join(os.fsencode(p) + b"\0" for p in paths), mode=0o600)
    _run(sandbox, f"mkdir -p {_ARCHIVE_DIR} && bash -c {shlex.quote(script)} < {stem}.in > {stem}.out", what)
    out = sandbox.read_file(f"{stem}.out")
    _run(sandbox, f"rm -f {stem}.in {stem}.out", what)
    return os.fsdecode(out)


def _run(sandbox: VerifiedSandbox, command: str, what: str) -> str:
    result = sandbox.exec(command, timeout_s=600, cwd="/")
    if not result.ok:
        raise SandboxError(f"{what} in the verifier's sandbox failed: {result.stderr[-500:]}")
    return result.stdout
