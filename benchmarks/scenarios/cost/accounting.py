"""CPU seconds by process kind over a window, from ``/proc/<pid>/stat`` (no ``perf`` needed).

A :class:`ProcessTable` is every process's user and kernel time at one moment,
with the time of the children it has reaped. Two of them give a window's CPU
by kind (:func:`by_kind`):

``runner``           the runner's Python process, all its threads
``runner children``  processes the runner started and reaped: the no-isolation baseline's shells, and
                     the last moments of a daemon that ended (after the sampler last saw it)
``daemon``           the sandbox daemon's main process (its comm is ``snapgym-sandbox``) and its netmaker
                     (``snapgym-netstock``), which makes network namespaces ahead for new sandboxes
``keepers``          the per-sandbox keepers (``snapgym-keeper``), and keepers that ended
``janitors``         the keepers' cleanup processes (``snapgym-janitor``)
``instances``        everything a keeper started: each instance's init, its exec helpers, the
                     agent's and the verifier's shells; dead ones through the keeper's reaped time
``kernel threads``   kworkers, RCU and softirq threads (children of kthreadd): deferred teardown
                     of namespaces and cgroups lands here, and so does every other tenant's

Tables taken during the window (a sampler) see processes that die before its
end: each counts from its first sight to its last, and only what it did after
its last sight is left to its parent's reaped time (an ended daemon's last
moments land in ``runner children``). Each kind counts only the window's work.
Only the runner's descendants count: another tenant's daemon is ``other``.
Kernel threads are machine-wide: on a shared machine they carry other tenants'
work too, so they are reported beside the run's own kinds, never summed in.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

_TICKS_PER_S = os.sysconf("SC_CLK_TCK")
KINDS = ("runner", "runner children", "daemon", "keepers", "janitors", "instances")
"""The kinds that are the run's own processes, in the order the tables show them."""
KERNEL_THREADS = "kernel threads"
_CHILDREN_OF = {"runner": "runner children", "daemon": "keepers", "keepers": "instances"}
"""Whose reaped time goes where: a dead keeper is the daemon's child; a dead instance the keeper's."""


@dataclass(frozen=True, slots=True)
class ProcessTimes:
    """One process's CPU seconds at one moment (``/proc/<pid>/stat``)."""

    pid: int
    ppid: int
    started: int
    """Start time in clock ticks after boot: with the pid, the process's identity."""
    kind: str
    user_s: float
    system_s: float
    children_user_s: float
    """Of the children it has waited for (and their reaped children)."""
    children_system_s: float


@dataclass(frozen=True, slots=True)
class KindTimes:
    """CPU seconds of one kind of process in a window."""

    user_s: float = 0.0
    system_s: float = 0.0

    @property
    def total_s(self) -> float:
        """User plus kernel seconds."""
        return self.user_s + self.system_s

    def plus(self, user_s: float, system_s: float) -> KindTimes:
        """These times with more added."""
        return KindTimes(self.user_s + user_s, self.system_s + system_s)


@dataclass(frozen=True, slots=True)
class ProcessTable:
    """Every process on the machine at one moment, classified (see the module docstring)."""

    processes: dict[tuple[int, int], ProcessTimes]

    @classmethod
    def now(cls, runner_pid: int | None = None) -> ProcessTable:
        """Read ``/proc`` now; ``runner_pid`` (default: this process) is the runner."""
        runner = os.getpid() if runner_pid is None else runner_pid
        raw = [entry for pid in _pids() if (entry := _read(pid)) is not None]
        parents = {pid: ppid for pid, ppid, *_ in raw}
        titles = {pid: title for pid, _, title, *_ in raw}
        table: dict[tuple[int, int], ProcessTimes] = {}
        for pid, ppid, _, comm, started, times in raw:
            kind = _kind(pid, comm, titles, parents, runner)
            table[(pid, started)] = ProcessTimes(pid, ppid, started, kind, *times)
        return cls(table)


def by_kind(samples: Sequence[ProcessTable]) -> dict[str, KindTimes]:
    """CPU seconds of each kind from the first table to the last (kinds with none are left out).

    Tables in between catch processes that die before the last one: each process counts from
    its first sight (or its birth) to its last, and the nearest ancestor seen after it had died
    counts only the rest of it (what it did after its last sight), through its reaped time.
    """
    first_seen: dict[tuple[int, int], ProcessTimes] = {}
    last_seen: dict[tuple[int, int], tuple[int, ProcessTimes]] = {}
    for index, table in enumerate(samples):
        for key, times in table.processes.items():
            first_seen.setdefault(key, times)
            last_seen[key] = (index, times)
    kinds: dict[str, KindTimes] = defaultdict(KindTimes)
    for key, (_, last) in last_seen.items():
        user, system = last.user_s, last.system_s
        c_user, c_system = last.children_user_s, last.children_system_s
        if key in samples[0].processes:
            first = first_seen[key]
            user, system = user - first.user_s, system - first.system_s
            c_user, c_system = c_user - first.children_user_s, c_system - first.children_system_s
        kinds[last.kind] = kinds[last.kind].plus(user, system)
        heir = _CHILDREN_OF.get(last.kind, last.kind)
        kinds[heir] = kinds[heir].plus(c_user, c_system)
    for index, gone in last_seen.values():
        if index == len(samples) - 1:
            continue  # alive at the end
        heir_of_gone = _heir_of(gone, index, samples, last_seen)
        if heir_of_gone is not None:  # its time up to its last sight is in its heir's reaped time too: take it off
            user = gone.user_s + gone.children_user_s
            system = gone.system_s + gone.children_system_s
            kinds[heir_of_gone] = kinds[heir_of_gone].plus(-user, -system)
    return {kind: times for kind, times in kinds.items() if kind in (*KINDS, KERNEL_THREADS)}


def _heir_of(
    gone: ProcessTimes, index: int, samples: Sequence[ProcessTable],
    last_seen: dict[tuple[int, int], tuple[int, ProcessTimes]],
) -> str | None:  # fmt: skip
    """The kind whose reaped time holds a process last seen in table ``index``: that of its nearest
    ancestor seen later (None: none was, and its time after its last sight is not counted)."""
    by_pid = {times.pid: (key, times) for key, times in samples[index].processes.items()}
    parent = by_pid.get(gone.ppid)
    while parent is not None:
        key, times = parent
        if last_seen[key][0] > index:
            return _CHILDREN_OF.get(times.kind, times.kind)
        parent = by_pid.get(times.ppid)
    return None


def _kind(pid: int, comm: str, titles: dict[int, str], parents: dict[int, int], runner: int) -> str:
    """The kind of a process; another tenant's sandbox daemon and its processes are ``other``."""
    if pid == runner:
        return "runner"
    if pid == 2 or parents.get(pid) == 2:
        return KERNEL_THREADS
    chain = [pid]
    while chain[-1] > 1 and chain[-1] != runner and len(chain) < 64:
        chain.append(parents.get(chain[-1], 0))
    if chain[-1] != runner:
        return "other"
    if titles[pid].startswith("snapgym-keeper"):
        return "keepers"
    if titles[pid].startswith("snapgym-janitor"):
        return "janitors"
    if titles[pid].startswith("snapgym-netstock"):
        return "daemon"
    if comm.startswith("snapgym-sandbox") and len(chain) == 2:
        return "daemon"
    if any(titles.get(ancestor, "").startswith("snapgym-keeper") for ancestor in chain[1:]):
        return "instances"
    return "runner children"


def _pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def _read(pid: int) -> tuple[int, int, str, str, int, tuple[float, float, float, float]] | None:
    """(pid, ppid, title, comm, start ticks, (utime, stime, cutime, cstime) in seconds); None: it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            text = stat.read().decode("utf-8", "replace")
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            title = cmdline.read(64).split(b"\0", 1)[0].decode("utf-8", "replace")
    except OSError:
        return None
    comm = text[text.index("(") + 1 : text.rindex(")")]
    fields = text[text.rindex(")") + 2 :].split()
    # fields[0] is state (field 3); utime..cstime are fields 14..17, starttime field 22
    ticks = [int(value) / _TICKS_PER_S for value in fields[11:15]]
    return pid, int(fields[1]), title, comm, int(fields[19]), (ticks[0], ticks[1], ticks[2], ticks[3])
