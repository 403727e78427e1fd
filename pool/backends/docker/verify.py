"""The Docker backend's side of ``sandbox.begin_verification`` (see :mod:`pool.verification`).

``strict``: the agent's container is killed first (its init dies, and with it
every process of its PID namespace), then the verifier gets a fresh container
at the known-good snapshot (the sandbox's prewarmed spare when that is the
one) with its own namespaces and resource budget. Into it go only the
``outputs``, copied from the dead container through the engine's archive API
(an output that is not a folder there is shown empty and reported), the
task's tests at ``/tests``, and empty private folders. The helper then
removes every link in the outputs that would lead into ``/tests``, a private
folder's top-level folder, ``/proc`` or ``/sys`` (following links as the
kernel would), and reports it.

``shared`` (Harbor's way: the verifier runs in the agent's container, beside
its live processes and its files): ``/tests`` and the private folders are
emptied and refilled, so nothing the agent wrote there before is left; the
loader, shell and Python hooks (:data:`pool.verification.SHARED_HOOKS`) and
the top-level links (``/bin``...) are put back as the known-good snapshot has
them (read once per snapshot: :mod:`pool.backends.docker.hooks`); links the
agent left (anywhere in its writable layer, per ``docker diff``) into the
private paths are removed. What does not hold, and is said
in the report's notes and ``Capabilities.verifier_isolation == "none"``: the
agent's processes share the verifier's PID namespace, mounts and user, so
while the tests run they can still write any file (the reward included),
signal or trace the verifier's processes, and change the outputs (they are
not frozen). Use strict verification for agents that are not trusted.
"""

from __future__ import annotations

import posixpath
import tarfile
import tempfile
from collections.abc import Callable, Iterable
from typing import Any

from pool.backends.docker.hooks import KnownGoodHooks
from pool.backends.docker.transport import files
from pool.backends.docker.transport.containers import Containers
from pool.backends.docker.transport.engine import engine_errors
from pool.backends.docker.transport.execution import run_helper
from pool.errors import ConfigError, SandboxCrashedError
from pool.snapshots import Snapshot
from pool.verification import SHARED_HOOKS, VerificationPlan, VerificationReport, VerifyMode, outermost

SHARED_NOTE = (
    "docker shared verification runs in the agent's container: the agent's live processes can still write any "
    "file while the tests run (/tests and the reward folder included), change the outputs (not frozen) and "
    "signal or trace the verifier's processes; use strict verification for untrusted agents"
)


def strict(
    api: Any,
    containers: Containers,
    agent: str,
    plan: VerificationPlan,
    *,
    known_good: Snapshot,
    start_verifier: Callable[[Snapshot], str],
) -> tuple[str, VerificationReport]:
    """Kill the agent's container and start the verifier's at ``known_good`` (see :func:`known_good_of`)
    with ``start_verifier``; (the verifier's container, the report)."""
    containers.kill(agent)  # every process of the agent is gone before anything else
    verifier = start_verifier(known_good)
    try:
        for container in (agent, verifier):  # the dead agent's outputs readable, room for them in the verifier's
            containers.widen_disk(container)
        outputs = outermost(plan.outputs)
        _helper(api, verifier, ["fresh", *outputs, plan.tests_path, *plan.private_dirs])
        missing = tuple(out for out in outputs if not _copy_folder(api, agent, verifier, out))
        _put_tests(api, verifier, plan)
        removed = audit(api, verifier, plan, walk=outputs)
    except BaseException:
        containers.remove_later(verifier)
        raise
    containers.remove_later(agent)
    return verifier, VerificationReport(VerifyMode.STRICT, removed_links=removed, missing_outputs=missing)


def shared(
    api: Any, hooks_cache: KnownGoodHooks, container: str, plan: VerificationPlan, *, known_good: Snapshot
) -> VerificationReport:
    """Prepare the agent's own container for its verifier, with the hooks of ``known_good`` (see
    :func:`known_good_of`); the report."""
    hooks = hooks_cache.archive(known_good)
    with engine_errors("listing the agent's changes", missing=_gone):
        changed = [str(c["Path"]) for c in api.diff(container) or () if c.get("Kind") in (0, 1)]
    missing = tuple(out for out in outermost(plan.outputs) if not _is_folder(api, container, out))
    _helper(api, container, ["remove", *SHARED_HOOKS, *hooks.top_links])
    _helper(api, container, ["fresh", plan.tests_path, *plan.private_dirs, *missing])
    if hooks.path is not None:
        with hooks.path.open("rb") as f:
            files.put_archive(api, container, "/", f)
    _put_tests(api, container, plan)
    private = (plan.tests_path, *plan.private_dirs)
    check = [p for p in changed if not any(p == q or p.startswith(q + "/") for q in private)]
    removed = audit(api, container, plan, walk=[o for o in plan.outputs if o not in missing], check=check)
    return VerificationReport(VerifyMode.SHARED, removed_links=removed, missing_outputs=missing, notes=(SHARED_NOTE,))


def known_good_of(plan: VerificationPlan, start: Snapshot, *, check: Callable[[Snapshot], None]) -> Snapshot:
    """The snapshot a sandbox that started at ``start`` is verified against: the plan's (which ``check``
    accepts as the backend's), else ``start``.

    Raises:
        ConfigError: ``start`` is neither that snapshot nor a checkpoint of it.
    """
    known_good = plan.known_good or start
    check(known_good)
    base = tuple(known_good.layers)
    if start.digest != known_good.digest and (
        start.base != known_good.base or tuple(start.layers[: len(base)]) != base
    ):
        raise ConfigError(
            f"the sandbox started from snapshot {start.id}, which is not {known_good.id} or a checkpoint of it; "
            "verify against the snapshot the episode started from"
        )
    return known_good


def audit(
    api: Any, container: str, plan: VerificationPlan, *, walk: Iterable[str], check: Iterable[str] = ()
) -> tuple[str, ...]:
    """Remove the links under ``walk`` (and among ``check``) that lead into the verifier's private paths.

    Returns:
        "path -> target" for each link removed.
    """
    records = [f"T{plan.tests_path}", *(f"P{p}" for p in plan.private_dirs)]
    records += [f"W{p}" for p in walk] + [f"C{p}" for p in check]
    out = _helper(api, container, ["audit"], stdin=b"".join(r.encode() + b"\0" for r in records))
    return tuple(" -> ".join(entry.decode(errors="replace").split("\x1f", 1)) for entry in out.split(b"\0") if entry)


# -- internals -------------------------------------------------------------------------


def _copy_folder(api: Any, source: str, dest: str, path: str) -> bool:
    """Copy the folder at ``path`` from one container into the other's (emptied) one; False when not a folder."""
    if not _is_folder(api, source, path):
        return False
    with files.get_archive(api, source, path) as response:
        files.put_archive(api, dest, posixpath.dirname(path), response.iter_content(1 << 16))
    return True


def _is_folder(api: Any, container: str, path: str) -> bool:
    mode = files.mode_at(api, container, path)
    return mode is not None and files.is_folder(mode)


def _put_tests(api: Any, container: str, plan: VerificationPlan) -> None:
    if not plan.tests_dir.is_dir():
        raise ConfigError(f"the tests folder {plan.tests_dir} does not exist")
    name = posixpath.basename(plan.tests_path)

    def owned_by_root(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.uid = info.gid = 0
        info.uname = info.gname = "root"
        return info

    with tempfile.SpooledTemporaryFile(max_size=16 << 20) as archive:
        with tarfile.open(fileobj=archive, mode="w", format=tarfile.PAX_FORMAT) as tar:
            top = tar.gettarinfo(str(plan.tests_dir), arcname=name)
            top.mode = 0o755
            tar.addfile(owned_by_root(top))
            for entry in sorted(plan.tests_dir.iterdir()):
                tar.add(entry, arcname=f"{name}/{entry.name}", filter=owned_by_root)
        archive.seek(0)
        files.put_archive(api, container, posixpath.dirname(plan.tests_path), archive)


def _helper(api: Any, container: str, args: list[str], *, stdin: bytes | None = None) -> bytes:
    code, out, err = run_helper(api, container, args, stdin=stdin)
    if code != 0:
        raise SandboxCrashedError(
            f"preparing the verifier failed ({args[0]}, exit {code}): {err.decode(errors='replace').strip()[-500:]}"
        )
    return out


def _gone(why: str) -> SandboxCrashedError:
    return SandboxCrashedError(f"the sandbox's container is gone ({why})")
