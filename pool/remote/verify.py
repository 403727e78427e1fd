"""A cloud backend's side of ``sandbox.begin_verification``: strict mode (see :mod:`pool.verification`).

The agent's outputs are archived in its sandbox and read out; then that
sandbox is killed at the provider (its machine, and every process the agent
started, ends before anything of the verifier's runs), and the verifier gets a
fresh sandbox at the known-good snapshot (the spare, when that is the one). Into it
go the outputs, extracted by the verifier's own ``tar`` (the known-good one:
an archive made by a ``tar`` the agent replaced cannot write outside the
outputs, through ``..`` or through links it plants, because the extraction is
limited to the output members and GNU tar defers links until the end), the
task's tests at ``/tests``, and fresh private folders. Then every link in the
outputs that leads (as the kernel resolves it) into ``/tests``, a private
folder or its top-level folder, ``/proc`` or ``/sys`` is removed and
reported.

Shared mode (the verifier beside the agent's live processes) is not offered:
nothing inside one provider sandbox would keep them from the reward.
"""

from __future__ import annotations

import errno
import posixpath
import shlex
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

from pool.errors import FileOperationError, SandboxError
from pool.verification import VerificationPlan, VerificationReport, VerifyMode, outermost

if TYPE_CHECKING:
    from pool.remote.sandbox import RemoteSandbox

MAX_OUTPUTS_BYTES = 512 << 20
"""The largest archive of outputs carried to the verifier."""
_ARCHIVE_DIR = "/tmp/.snapgym-verify"


def collect_outputs(sandbox: RemoteSandbox, plan: VerificationPlan) -> tuple[bytes, tuple[str, ...], tuple[str, ...]]:
    """In the agent's sandbox: (a tar of the outputs that are folders, the ones carried, the missing ones)."""
    carried: list[str] = []
    missing: list[str] = []
    for out in outermost(plan.outputs):
        is_folder = sandbox.exec(f"test -d {shlex.quote(out)} && test ! -L {shlex.quote(out)}", timeout_s=60).ok
        (carried if is_folder else missing).append(out)
    if not carried:
        return b"", (), tuple(missing)
    archive = f"{_ARCHIVE_DIR}/{uuid.uuid4().hex}.tar"
    members = " ".join(shlex.quote(out.lstrip("/")) for out in carried)
    made = sandbox.exec(
        f"mkdir -p {_ARCHIVE_DIR} && tar -C / -cf {archive} {members} && stat -c %s {archive}", timeout_s=600
    )
    size = made.stdout.strip().splitlines()[-1] if made.stdout.strip() else ""
    if not made.ok or not size.isdigit():
        raise SandboxError(f"archiving the outputs {carried} for the verifier failed: {made.stderr[-500:]}")
    if int(size) > MAX_OUTPUTS_BYTES:
        raise SandboxError(
            f"the outputs {carried} are {int(size) >> 20} MiB, over the {MAX_OUTPUTS_BYTES >> 20} MiB a strict "
            "verification on a cloud backend carries"
        )
    return sandbox.read_file(archive), tuple(carried), tuple(missing)


def install(sandbox: RemoteSandbox, plan: VerificationPlan, archive: bytes, carried: tuple[str, ...],
            missing: tuple[str, ...]) -> VerificationReport:  # fmt: skip
    """In the verifier's fresh sandbox: the outputs, the tests, fresh private folders, and the link audit."""
    private = (plan.tests_path, *plan.private_dirs)
    fresh = " ".join(shlex.quote(path) for path in (*outermost(plan.outputs), *private))
    _run(sandbox, f"rm -rf {fresh} && mkdir -p {fresh}", "preparing the verifier's folders")
    if archive:
        path = f"{_ARCHIVE_DIR}/{uuid.uuid4().hex}.tar"
        sandbox.write_file(path, archive, mode=0o600)
        members = " ".join(shlex.quote(out.lstrip("/")) for out in carried)
        _run(sandbox, f"tar -C / -xpf {path} {members} && rm -f {path}", "unpacking the outputs")
    _put_tests(sandbox, plan)
    removed = _remove_escaping_links(sandbox, carried, private)
    return VerificationReport(VerifyMode.STRICT, removed_links=removed, missing_outputs=missing)


def _put_tests(sandbox: RemoteSandbox, plan: VerificationPlan) -> None:
    root = Path(plan.tests_dir)
    if not root.is_dir():
        raise FileOperationError(errno.ENOENT, f"the task's tests folder {root} is missing", str(root))
    for source in sorted(root.rglob("*")):
        if source.is_symlink() or not source.is_file():
            continue
        target = posixpath.join(plan.tests_path, source.relative_to(root).as_posix())
        sandbox.write_file(target, source.read_bytes(), mode=source.stat().st_mode & 0o777)


def _remove_escaping_links(
    sandbox: RemoteSandbox, outputs: tuple[str, ...], private: tuple[str, ...]
) -> tuple[str, ...]:
    if not outputs:
        return ()
    guarded = {*private, *("/" + p.strip("/").split("/")[0] for p in private), "/proc", "/sys"}
    patterns = "|".join(f"{shlex.quote(g)}|{shlex.quote(g)}/*" for g in sorted(guarded))
    script = (
        f"find {' '.join(shlex.quote(o) for o in outputs)} -xdev -type l -print0 | "
        "while IFS= read -r -d '' link; do target=$(readlink -f -- \"$link\"); "
        f'case "$target" in {patterns}) rm -f -- "$link"; printf \'%s\\n\' "$link";; esac; done'
    )
    result = _run(sandbox, f"bash -c {shlex.quote(script)}", "removing links into the verifier's paths")
    return tuple(line for line in result.splitlines() if line)


def _run(sandbox: RemoteSandbox, command: str, what: str) -> str:
    result = sandbox.exec(command, timeout_s=600, cwd="/")
    if not result.ok:
        raise SandboxError(f"{what} in the verifier's sandbox failed: {result.stderr[-500:]}")
    return result.stdout
