"""Fork: what it costs to branch a mid-episode state into 1..128 children.

Method:
    One episode of the trivial task runs a few steps that change files (so
    the state differs from the task snapshot), then ``checkpoint()`` freezes
    it into a snapshot (timed as ``checkpoint``, ``repetitions`` times, each
    after one more change). For each n in ``children``, ``env.fork(n, snap)``
    is timed: n environments whose sandboxes already sit at the checkpoint,
    through the configured pool (``direct``: the backend's fork; ``ray``:
    checkpoints live on their node, so children are restored there). Every
    child is then checked to hold the checkpoint's file (untimed) and
    closed (untimed). ``warmup`` forks of the smallest n run first and are
    discarded. Reported per n: percentiles of the fork call, and the p50
    divided by n (cost per child). Memory: MemTotal - MemAvailable of this
    machine read before each fork of the largest n and again once the fork
    returned (children alive, before the check), divided by n: the marginal
    memory per child, as a median over the repetitions (on ``pool=ray`` the
    children may sit on other nodes: no figure then).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from benchmarks.job import Job
from benchmarks.reports.report import Report
from benchmarks.reports.stats import percentile
from benchmarks.scenarios.eval import open_supply
from benchmarks.scenarios.measure.timing import measure
from benchmarks.scenarios.throughput import TRIVIAL_TASK
from benchmarks.schemas import PoolKind
from envs.tasks import load_task
from envs.wrappers import sandbox_env
from pool.cluster.host import used_memory_bytes
from pool.errors import ConfigError


@dataclass
class ForkBenchConfig:
    """Branching cost by number of children."""

    name: str = "fork"
    """Scenario name."""
    children: list[int] = field(default_factory=lambda: [1, 2, 4, 8, 16, 32, 64, 128])
    """Numbers of children to fork into."""
    repetitions: int = 5
    """Timed forks per number of children."""
    warmup: int = 2
    """Discarded forks first."""


def run(job: Job) -> Report:
    """Time checkpoint and fork; see the module docstring."""
    cfg: ForkBenchConfig = job.settings
    if not cfg.children or min(cfg.children) < 1 or cfg.repetitions < 1:
        raise ConfigError("benchmark.children must be positive numbers and benchmark.repetitions >= 1")
    supply = open_supply(job, job.config)
    env = supply.make_env("snapgym/Shell-v0", load_task(TRIVIAL_TASK), max_steps=10**6)
    base = sandbox_env(env)
    try:
        env.reset(seed=0)
        env.step("echo ok > /app/answer.txt && mkdir -p /app/work && seq 1000 > /app/work/numbers")
        counter = iter(range(10**9))
        checkpoint = measure(
            base.checkpoint,
            repetitions=cfg.repetitions,
            before=lambda: env.step(f"echo {next(counter)} > /app/work/step"),
        )
        snapshot = base.checkpoint()
        methods: dict[str, list[float]] = {"checkpoint": checkpoint}
        sizes = sorted(set(cfg.children))
        memory = _MemoryPerChild(sizes[-1])
        for index, n in enumerate(sizes):
            largest = n == sizes[-1]
            methods[f"fork_{n}"] = measure(
                lambda n=n: base.fork(n, snapshot),  # type: ignore[misc]
                repetitions=cfg.repetitions,
                warmup=cfg.warmup if index == 0 else 0,
                before=memory.before if largest else None,
                after=memory.after if largest else _check_and_close,
            )
    finally:
        env.close()
        supply.close()
    per_child: dict[str, float | None] = {
        f"fork_{n}_per_child_ms": percentile(methods[f"fork_{n}"], 50) / n for n in sizes
    }
    per_child[f"fork_{sizes[-1]}_memory_per_child_mib"] = memory.median_mib()
    meta = {"pool": PoolKind(job.config.pool.kind).value, **per_child}
    return Report("fork", methods, meta=meta, headline=per_child)


class _MemoryPerChild:
    """This machine's used memory before a fork and after it returned, per child."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.baseline = 0
        self.samples: list[float] = []

    def before(self) -> None:
        self.baseline = used_memory_bytes()

    def after(self, children: list[object]) -> None:
        self.samples.append((used_memory_bytes() - self.baseline) / self.n / 2**20)
        _check_and_close(children)

    def median_mib(self) -> float | None:
        """The median per-child figure; None when memory fell meanwhile (other processes freed some)."""
        value = percentile(self.samples, 50) if self.samples else None
        return value if value is not None and value > 0 else None


def _check_and_close(children: list[object]) -> None:
    for child in children:
        sandbox = child.sandbox  # type: ignore[attr-defined]
        if sandbox.read_file("/app/answer.txt") != b"ok\n":
            raise AssertionError("a forked child does not hold the checkpoint's files")
        child.close()  # type: ignore[attr-defined]
