"""Per-sandbox cgroups for memory, CPU and process-count limits (v1 or v2).

The daemon's keeper creates a cgroup per instance (one per episode, and one
per verifier), ``snapgym/<sandbox>-i<N>`` (``-v<N>`` for a shared-mode
verifier), and writes the limits there (:meth:`SandboxCgroup.limit_settings`),
so what a finished episode leaves charged (tmpfs pages, page cache, dying
processes) never counts against the next one. A dead instance's cgroups are
reused for a later instance only when the keeper proves them clean first
(``sandboxd/keeper/cgpool.c``: no member, nothing charged, limits re-set, records
re-based); the replies say what was reused (:func:`reused_of`).

The instance cgroups sit side by side, with no cgroup per sandbox above them:
the kernel keeps, for every memory cgroup, a slot per superblock shrinker on
the machine, and every sandbox brings several superblocks, so each memory
cgroup a sandbox adds costs memory in proportion to the number of sandboxes.
Used when the backend runs as root and a cgroup hierarchy is writable; when
not, the backend falls back to rlimits and says so in its Capabilities.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
_PARENT = "snapgym"


@dataclass(frozen=True, slots=True)
class Limits:
    """Resource limits of one sandbox; None means unlimited."""

    memory_bytes: int | None = None
    cpus: float | None = None
    pids: int | None = None


def reused_of(reply: Mapping[str, str]) -> dict[str, bool]:
    """What a daemon reply says the instance got from a dead one (``reused_cgroup``/``reused_netns``),
    each proven clean by the keeper first (sandboxd/keeper/cgpool.c, sandboxd/keeper/netproof.c)."""
    return {"cgroup": reply.get("reused_cgroup") == "1", "netns": reply.get("reused_netns") == "1"}


def _v2() -> bool:
    return (CGROUP_ROOT / "cgroup.controllers").exists()


def _make_parent(folder: Path) -> None:
    """Create snapgym's folder in a hierarchy unless it is there (it is after the first sandbox).

    Looked at first: a mkdir of a folder that exists still locks the hierarchy's root for a create
    (10 µs a sandbox here, against 5 for the look)."""
    if not os.path.isdir(folder):
        folder.mkdir(exist_ok=True)


def _v1_controller(name: str) -> Path | None:
    path = CGROUP_ROOT / name
    return path if (path / "cgroup.procs").exists() else None


def memory_of_process(pid: int) -> int | None:
    """The memory charge of the memory cgroup ``pid`` is in (its own, not its parent's); None when unknown."""
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if _v2() and controllers == "":
            target = CGROUP_ROOT / path.lstrip("/") / "memory.current"
        elif "memory" in controllers.split(","):
            target = CGROUP_ROOT / "memory" / path.lstrip("/") / "memory.usage_in_bytes"
        else:
            continue
        try:
            return int(target.read_text())
        except (OSError, ValueError):
            return None
    return None


def available() -> set[str]:
    """Which limits can be enforced here: a subset of {"memory", "cpu", "pids"}."""
    if os.geteuid() != 0:
        return set()
    if _v2():
        controllers = (CGROUP_ROOT / "cgroup.controllers").read_text().split()
        return {c for c in ("memory", "cpu", "pids") if c in controllers}
    return {c for c in ("memory", "cpu", "pids") if _v1_controller(c)}


class SandboxCgroup:
    """The cgroups of one sandbox's instances: ``dirs`` holds, per hierarchy, the path each
    instance's directory name starts with (``<hierarchy>/snapgym/<sandbox>``, plus ``-i<N>``)."""

    def __init__(self, name: str, limits: Limits, enabled: set[str]) -> None:
        self.name = name
        self.dirs: list[Path] = []
        self.limits = limits
        self.enabled: set[str] = set()
        self._add(enabled)

    def set_limits(self, limits: Limits, enabled: set[str]) -> None:
        """The limits of the next instances (a restore to a snapshot that asks for other resources)."""
        self._add(enabled - self.enabled)
        self.limits = limits

    def _add(self, controllers: set[str]) -> None:
        if not controllers:
            return
        self.enabled |= controllers
        if _v2():
            parent = CGROUP_ROOT / _PARENT
            _make_parent(parent)
            _enable_v2_controllers(parent, self.enabled)
            path = parent / self.name
            if path not in self.dirs:
                self.dirs.append(path)
            return
        for controller in sorted(controllers):
            base = _v1_controller(controller)
            if base is None:
                continue
            _make_parent(base / _PARENT)
            self.dirs.append(base / _PARENT / self.name)

    def limit_settings(self) -> list[tuple[str, str]]:
        """(file, value) pairs each instance's cgroup gets; files a hierarchy lacks are skipped."""
        limits, enabled = self.limits, self.enabled
        settings: list[tuple[str, str]] = []
        if "memory" in enabled and limits.memory_bytes:
            memory = str(limits.memory_bytes)
            settings += [("memory.max", memory), ("memory.swap.max", "0")]  # v2
            settings += [("memory.limit_in_bytes", memory), ("memory.memsw.limit_in_bytes", memory)]  # v1
        if "pids" in enabled and limits.pids:
            settings.append(("pids.max", str(limits.pids)))
        if "cpu" in enabled and limits.cpus:
            quota = str(int(limits.cpus * 100000))
            settings += [("cpu.max", f"{quota} 100000"), ("cpu.cfs_period_us", "100000"), ("cpu.cfs_quota_us", quota)]
        return settings

    def instance_dirs(self) -> list[Path]:
        """The cgroup directories of the sandbox's instances that exist now, in every hierarchy."""
        found = []
        for prefix in self.dirs:
            # by name first, then the entry's type (kernfs gives it: no stat); a v1 parent also
            # holds its control files and every other sandbox's directories
            found += [prefix.parent / name for name in _subdirectories(prefix.parent, prefix.name)]
        return found

    def memory_bytes(self) -> int | None:
        """Current memory charge of the sandbox (all its instances), when memory cgroups exist."""
        total, seen = 0, False
        for d in self.instance_dirs():
            for name in ("memory.current", "memory.usage_in_bytes"):
                with contextlib.suppress(OSError, ValueError):
                    total += int((d / name).read_text())
                    seen = True
                    break
        return total if seen else None

    def remove(self) -> None:
        """Kill anything left inside and delete the instances' cgroup directories."""
        for d in self.instance_dirs():
            kill_and_remove(d)
        self.dirs = []


def _subdirectories(parent: Path, sandbox: str | None = None) -> list[str]:
    """Names of the directories in ``parent`` (only ``sandbox``'s instances, when given); none when it is gone.

    A cgroup directory holds dozens of control files: names are filtered before types, and a
    type comes from the directory entry (kernfs fills it in) rather than a stat of each.
    """
    try:
        with os.scandir(parent) as entries:
            return [
                entry.name
                for entry in entries
                if (sandbox is None or _instance_of(entry.name, sandbox)) and entry.is_dir(follow_symlinks=False)
            ]
    except OSError:
        return []


def _instance_of(directory: str, sandbox: str) -> bool:
    """Whether a cgroup directory name is an instance of the sandbox (``<sandbox>-i3``, ``<sandbox>-v1``)."""
    head, _, tail = directory.rpartition("-")
    return head == sandbox and len(tail) > 1 and tail[0] in "iv" and tail[1:].isdigit()


def _enable_v2_controllers(parent: Path, enabled: set[str]) -> None:
    wanted = " ".join(f"+{c}" for c in sorted(enabled))
    for directory in (CGROUP_ROOT, parent):
        # Already enabled, or delegated differently: limits still apply where possible.
        with contextlib.suppress(OSError):
            (directory / "cgroup.subtree_control").write_text(wanted)


def kill_and_remove(path: Path, *, timeout_s: float = 5.0) -> None:
    """SIGKILL every process in a cgroup directory and the ones below it, then remove them all.

    Killed processes leave the cgroup a little after the signal (a PID
    namespace is torn down asynchronously), so removal is retried briefly.
    """
    for name in _subdirectories(path):
        kill_and_remove(path / name, timeout_s=timeout_s)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            pids = [int(p) for p in (path / "cgroup.procs").read_text().split()]
        except OSError:
            return  # already gone
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if not pids:
            try:
                path.rmdir()
                return
            except OSError:
                pass
        if time.monotonic() > deadline:
            return  # left for reap_orphans() of a later backend
        time.sleep(0.002)


def stale_groups(is_alive: Callable[[str], bool]) -> list[Path]:
    """Cgroup directories of sandboxes whose owner is gone."""
    parents = (
        [CGROUP_ROOT / _PARENT]
        if _v2()
        else [base / _PARENT for c in ("memory", "cpu", "pids") if (base := _v1_controller(c))]
    )
    found = []
    for parent in parents:
        if not parent.is_dir():
            continue
        for child in parent.iterdir():
            if child.is_dir() and not is_alive(child.name):
                found.append(child)
    return found
