"""Check tasks: each loads, builds, its reference solution scores 1.0, doing nothing 0.0.

``python -m envs.check [--backend NAME] [--option KEY=VALUE ...] [--network SETTING] [--jobs N]
[--verbose] [TASK_ID_OR_DIR ...]`` (default: the built-in suite); ``--all DIR`` checks every task
directory in a folder. Each task is reported on one line, stage by stage (loads / builds /
oracle / noop), with the reason of the first stage that failed; one broken task never stops the
others. Exits non-zero when any task fails.

Each task is played as ``benchmarks.run`` plays it: in a :class:`~envs.shell.ShellEnv` under the
task's network policy per phase (or ``--network``), through the backend's egress, registry and
mirror options (``--option egress={...}``), verified in the task's mode. A verification the
network made fail is said as such (``oracle not scored: network_denied ...``), with the verifier's
failed connections, never as "oracle scored 0.0".
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import gymnasium as gym

from envs.episode.network import NetworkSetting, effective_policies, failed_connections, reached_hosts
from envs.shell import ShellEnv
from envs.spaces.actions import SUBMIT
from envs.tasks.oracle import run_solution
from envs.tasks.task import Task, builtin_task_ids, load_task, task_dirs
from envs.wrappers import sandbox_env
from pool.backends import load_backend
from pool.contract import Backend
from pool.errors import ConfigError, SnapgymError
from pool.network.audit import Connection, NetworkLog
from pool.network.policy import NetworkMode
from pool.verification import VerifyMode

_REASON_CHARS = 400


@dataclass(frozen=True, slots=True)
class Play:
    """How one play of a task ended: its reward as the runner would record it."""

    reward: float | None
    """The reward; None when the episode is unscored (see ``unscored_reason``)."""
    error: str | None = None
    """Why the reward is 0.0 by rule, or why the episode is unscored."""
    output: str = ""
    """The verifier's output (test.sh's stdout and stderr, capped)."""
    failed_connections: tuple[str, ...] = ()
    """The verifier's connections that did not get through: ``host:port (verdict: why)``."""
    reached: tuple[str, ...] = ()
    """``host:port`` of the verifier's connections that got through."""

    @classmethod
    def from_info(cls, reward: float, info: dict[str, Any]) -> Play:
        """The play an environment's final step describes (``reward`` and ``info``)."""
        verifier = info.get("verifier") or {}
        connections = (info.get("network") or {}).get("connections") or []
        log = NetworkLog(tuple(Connection(**c) for c in connections))
        failed, reached = failed_connections(log), reached_hosts(log)
        output = str(verifier.get("output") or "")
        if not info.get("scored", True):
            why = info.get("unscored_reason") or "unscored"
            hint = (info.get("network_failure") or {}).get("hint") or info.get("infra_error") or ""
            return cls(None, f"{why}: {hint}" if hint else why, output, failed, reached)
        return cls(float(reward), verifier.get("error"), output, failed, reached)


@dataclass(frozen=True, slots=True)
class TaskCheck:
    """The outcome of checking one task."""

    task_id: str
    oracle: Play
    noop: Play
    build_s: float

    @property
    def ok(self) -> bool:
        """The reference solution scores 1.0 and doing nothing scores 0.0."""
        return self.oracle.reward == 1.0 and self.noop.reward == 0.0


def check_task(backend: Backend, task: Task, *, network: NetworkSetting = None) -> TaskCheck:
    """Play the task twice as the runner would (see the module docstring): doing nothing, then
    its reference solution (``solution/solve.sh``, under the agent's network policy)."""
    env = ShellEnv(task, backend=backend, network=network)
    try:
        return check_in(env, task)
    finally:
        env.close()


def check_in(env: gym.Env[Any, str], task: Task) -> TaskCheck:
    """:func:`check_task` in an environment of ``task`` made by the caller (the runner makes its own,
    with the run's backend or pool, verification mode and network); the caller closes it."""
    started = time.perf_counter()
    env.reset()  # builds the task's snapshot
    build_s = time.perf_counter() - started
    _, reward, _, _, info = env.step(SUBMIT)
    noop = Play.from_info(float(reward), info)
    env.reset()
    sandbox = sandbox_env(env).sandbox
    assert sandbox is not None
    run_solution(sandbox, task)
    _, reward, _, _, info = env.step(SUBMIT)
    return TaskCheck(task.id, Play.from_info(float(reward), info), noop, build_s)


@dataclass(frozen=True, slots=True)
class TaskReport:
    """One task's stages: ``ok``, ``fail`` or ``-`` (not reached), and why the first failure failed."""

    task: str
    loads: str = "-"
    builds: str = "-"
    oracle: str = "-"
    noop: str = "-"
    reason: str = ""
    seconds: float = 0.0
    details: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """Every stage passed."""
        return (self.loads, self.builds, self.oracle, self.noop) == ("ok", "ok", "ok", "ok")

    def line(self) -> str:
        """The report as one line of the table."""
        status = "ok  " if self.ok else "FAIL"
        stages = f"loads={self.loads} builds={self.builds} oracle={self.oracle} noop={self.noop}"
        return f"{status} {self.task:40s} {stages} {self.seconds:6.1f}s{'  ' + self.reason if self.reason else ''}"


def check_one(backend: Backend, spec: str, *, network: NetworkSetting = None) -> TaskReport:
    """Every stage of one task; an error at any stage is the task's failure, never the run's."""
    started = time.perf_counter()
    name = Path(spec).name if "/" in spec else spec
    try:
        task = load_task(spec)
    except SnapgymError as exc:
        return TaskReport(name, loads="fail", reason=_one_line(exc), seconds=time.perf_counter() - started)
    try:
        backend.build(task.template)
    except SnapgymError as exc:
        return TaskReport(task.id, "ok", "fail", reason=_one_line(exc), seconds=time.perf_counter() - started)
    try:
        check = check_task(backend, task, network=network)
    except SnapgymError as exc:
        return TaskReport(task.id, "ok", "ok", "fail", reason=_one_line(exc), seconds=time.perf_counter() - started)
    report = _verdicts(check, time.perf_counter() - started)
    if _strict_may_be_the_cause(task, check, network):
        report = replace(report, reason=f"{report.reason}; {STRICT_CAUSE}")
    return report


STRICT_CAUSE = (
    "strict mode is the likely cause: it verifies with only the task's outputs, so what the solution "
    "installed elsewhere is gone (benchmarks.run's calibration can choose shared mode for it, or "
    'declare [snapgym] verification = "shared")'
)
"""Said after a strict 0 of a reference solution that may have installed packages (issue 30)."""


def _strict_may_be_the_cause(task: Task, check: TaskCheck, network: NetworkSetting) -> bool:
    """The reference solution scored below 1.0 in strict mode, with no failed verifier connection
    (those make the network's 0), after an agent phase that may use the network (so it may install)."""
    scored_low = check.oracle.reward is not None and check.oracle.reward < 1.0 and not check.oracle.failed_connections
    agent = effective_policies(task.settings.network, network).agent
    return scored_low and task.verification is VerifyMode.STRICT and agent.mode is not NetworkMode.NO_NETWORK


def _verdicts(check: TaskCheck, seconds: float) -> TaskReport:
    oracle_ok, noop_ok = check.oracle.reward == 1.0, check.noop.reward == 0.0
    reason = ""
    if check.oracle.reward is None:
        reason = f"oracle not scored: {check.oracle.error}"
    elif not oracle_ok:
        reason = f"oracle scored {check.oracle.reward} ({check.oracle.error or 'see --verbose'})"
    elif check.noop.reward is None:
        reason = f"doing nothing was not scored: {check.noop.error}"
    elif not noop_ok:
        reason = f"doing nothing scored {check.noop.reward}: the tests do not check the task"
    failed = check.oracle.failed_connections if not oracle_ok else check.noop.failed_connections
    if reason and failed:
        shown = ", ".join(failed[:4]) + (f" and {len(failed) - 4} more" if len(failed) > 4 else "")
        reason += f"; the verifier's connections that failed: {shown}"
    details = {name: verdict.output[-2000:] for name, verdict in (("oracle", check.oracle), ("noop", check.noop))}
    return TaskReport(
        check.task_id,
        "ok",
        "ok",
        "ok" if oracle_ok else "fail",
        "ok" if noop_ok else "fail",
        reason=reason,
        seconds=seconds,
        details=details,
    )


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:_REASON_CHARS]}"


def _specs(args: argparse.Namespace) -> Iterator[str]:
    for folder in args.all or ():
        yield from (str(path) for path in task_dirs(folder))
    yield from args.tasks
    if not args.tasks and not args.all:
        yield from builtin_task_ids()


def _options(pairs: list[str]) -> dict[str, object]:
    options: dict[str, object] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ConfigError(f"--option {pair!r} must be KEY=VALUE")
        try:
            options[key] = json.loads(value)
        except ValueError:
            options[key] = value
    return options


def main(argv: list[str] | None = None) -> int:
    """Check the tasks named on the command line; 0 when every one passes."""
    parser = argparse.ArgumentParser(prog="python -m envs.check", description=__doc__)
    parser.add_argument("tasks", nargs="*", help="task ids or directories (default: every built-in task)")
    parser.add_argument("--all", action="append", metavar="DIR", help="check every task directory in DIR")
    parser.add_argument("--backend", default="local", help="the backend to check on (default: local)")
    parser.add_argument(
        "--option", "-o", action="append", default=[], metavar="KEY=VALUE",
        help="a backend option (VALUE read as JSON when it parses, e.g. -o shared_verification=true)",
    )  # fmt: skip
    parser.add_argument(
        "--network", metavar="SETTING", default=None,
        help="the network of every play, as the runner's network= (default: each task's own policy per phase)",
    )  # fmt: skip
    parser.add_argument("--jobs", "-j", type=int, default=1, help="tasks checked at once (default 1)")
    parser.add_argument("--json", metavar="FILE", help="also write the reports as JSON lines to FILE")
    parser.add_argument("--verbose", "-v", action="store_true", help="print the verifier's output for every task")
    args = parser.parse_args(argv)
    try:
        specs = list(_specs(args))
        if args.jobs < 1:
            raise ConfigError(f"--jobs must be at least 1, got {args.jobs}")
        backend = load_backend(args.backend, **_options(args.option))
    except SnapgymError as exc:
        print(f"snapgym: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    reports = []
    try:
        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            for report in pool.map(lambda spec: check_one(backend, spec, network=args.network), specs):
                reports.append(report)
                print(report.line(), flush=True)
                if args.verbose or (not report.ok and report.details):
                    for name, output in report.details.items():
                        print(f"  {name}:\n    " + output.replace("\n", "\n    "))
    finally:
        backend.close()
    if args.json:
        Path(args.json).write_text("".join(json.dumps(asdict(r)) + "\n" for r in reports))
    failed = sum(not r.ok for r in reports)
    print(f"{len(reports) - failed} of {len(reports)} tasks pass")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
