"""snapgym's main job: ``python -m benchmarks.run [group=choice ...] [key=value ...]``.

Hydra composes ``configs/config.yaml`` (groups ``benchmark``, ``backend``,
``pool``, ``suite``, ``agent``, plus the run settings) against the schemas in
``benchmarks.config`` and ``benchmarks.schemas``, so a mistyped key, a wrong
type or an unknown choice stops the run before any sandbox starts. With no
arguments it evaluates the built-in suite with the reference-solution agent
on the local backend. Results go to Hydra's run directory (``outputs/...``).

Examples:
    python -m benchmarks.run
    python -m benchmarks.run agent=noop episodes_per_task=4 pass_at_k=[1,4]
    python -m benchmarks.run pool=ray pool.size=8
    python -m benchmarks.run resume=outputs/2026-11-29/12-00-00-eval
    python -m benchmarks.run benchmark=reset_latency
    python -m benchmarks.run -m benchmark=throughput pool.size=1,2,4,8
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import logging
import os
import shlex
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NoReturn, cast

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from benchmarks import multirun
from benchmarks.cli import check_choices, check_nested_keys, help_text
from benchmarks.config import (
    check_backend_options,
    check_pool_installed,
    register_configs,
    reject_unknown_keys,
    require_values,
)
from benchmarks.episodes.recording.ledger import LEDGER_FILE
from benchmarks.episodes.recording.rundir import PLAN_KEYS
from benchmarks.job import Job, Outcome, ScenarioStoppedError, top_level_key
from benchmarks.paths import expand_config_paths, quote_path_arguments
from benchmarks.schemas import RunConfig
from pool import ConfigError
from pool.errors import SnapgymError

# benchmark.name -> module whose ``run(job) -> Outcome`` measures it; imported lazily.
SCENARIOS: dict[str, str] = {
    "eval": "benchmarks.scenarios.eval",
    "reset_latency": "benchmarks.scenarios.reset_latency",
    "pool": "benchmarks.scenarios.pool",
    "throughput": "benchmarks.scenarios.throughput",
    "fork": "benchmarks.scenarios.fork",
    "integrity": "benchmarks.scenarios.integrity",
    "egress": "benchmarks.scenarios.egress",
    "burst": "benchmarks.scenarios.burst",
    "idle": "benchmarks.scenarios.idle",
    "durable": "benchmarks.scenarios.durable",
    "cost": "benchmarks.scenarios.cost",
    "soak": "benchmarks.scenarios.soak",
    "aio": "benchmarks.scenarios.aio.inflight",
}
EXIT_USAGE = 2
"""Exit status of a run refused for bad input (config, task, credentials) or stopped by the model's refusal."""
EXIT_INCOMPLETE = 4
"""Exit status of a run that finished with episodes its infrastructure left unscored (the cause is
printed; a resume plays them again)."""
EXIT_INTERRUPTED = 130
"""Exit status of a run stopped by Ctrl-C (128 + SIGINT): summary.json says ``interrupted``, and the
resume command is printed."""
EXIT_STOPPED = 3
"""Exit status of a run stopped early by its infrastructure (an outage past ``outage_timeout_s``, a model
endpoint, backend or Ray cluster that never answered, a ledger that could not be written): summary.json holds
what finished, and a resume plays the rest."""

Scenario = Callable[[Job], Outcome]

log = logging.getLogger(__name__)


def load_scenario(name: str) -> Scenario:
    """The ``run`` function of a scenario by name.

    Raises:
        ConfigError: no scenario has that name.
    """
    try:
        module_name = SCENARIOS[name]
    except KeyError:
        raise ConfigError(f"unknown benchmark {name!r}; choose one of: {', '.join(sorted(SCENARIOS))}") from None
    return cast(Scenario, importlib.import_module(module_name).run)


@hydra.main(config_path="configs", config_name="config", version_base="1.3")
def _run(cfg: DictConfig) -> None:
    hydra = HydraConfig.get()
    if hydra.mode != RunMode.MULTIRUN:
        _run_job(cfg)
        return
    with multirun.job_failures(Path(hydra.runtime.output_dir)):  # one failed job does not end the sweep
        _run_job(cfg)


def _run_job(cfg: DictConfig) -> None:
    hydra = HydraConfig.get()
    expand_config_paths(cfg)
    job = Job(cfg, Path(hydra.runtime.output_dir), tuple(hydra.overrides.task))
    try:
        reject_unknown_keys(cfg)
        require_values(cfg)
        check_backend_options(cfg)
        check_pool_installed(cfg)
        scenario = load_scenario(cfg.benchmark.name)
        log.info("running %s", cfg.benchmark.name)
        outcome = scenario(job)
    except KeyboardInterrupt:
        _interrupted(None, job)
    except ScenarioStoppedError as stop:
        if stop.interrupted:
            _interrupted(stop, job)
        if stop.outcome is not None:
            _show(stop.outcome, job.output_dir)
        _fail(f"run stopped: {one_line(str(stop))}", EXIT_STOPPED)
    except SnapgymError as exc:
        _fail(f"{type(exc).__name__}: {exc}", EXIT_USAGE)
    finally:
        job.close()
    _show(outcome, job.output_dir)
    incomplete = getattr(outcome, "incomplete", None)
    if callable(incomplete) and (why := incomplete()):
        _fail(f"run incomplete: {one_line(why)}", EXIT_INCOMPLETE)


def _interrupted(stop: ScenarioStoppedError | None, job: Job) -> None:
    """Ctrl-C: what finished, where the run is and how to resume it, then exit 130 (at once, with the job's
    backends closed, after a second Ctrl-C: episode threads may still be in their last step)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # one more Ctrl-C while this says where things are: no traceback
    if stop is not None and stop.outcome is not None:
        _show(stop.outcome, job.output_dir)
    reason = one_line(str(stop)) if stop is not None else "interrupted; the ledger holds what finished"
    print(f"snapgym: run interrupted: {reason}", file=sys.stderr)
    if stop is not None and stop.run_dir is not None:
        print(f"snapgym: run directory: {stop.run_dir}", file=sys.stderr)
        print(f"snapgym: resume with: {resume_command(stop.run_dir, job.overrides)}", file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    if stop is not None and stop.outcome is None:  # the second Ctrl-C: do not wait for the episode threads
        job.close()
        os._exit(EXIT_INTERRUPTED)
    sys.exit(EXIT_INTERRUPTED)


def resume_command(run_dir: Path, overrides: Sequence[str]) -> str:
    """The command line that continues the run in ``run_dir``: ``resume=`` and the overrides a resume still
    reads (backend, pool, ...; the plan comes from the run's saved ``run.yaml``)."""
    dropped = {*PLAN_KEYS, "resume", "output_dir"}
    kept = [o for o in overrides if top_level_key(o) not in dropped]
    return shlex.join([sys.executable.rsplit("/", 1)[-1], "-m", "benchmarks.run", f"resume={run_dir}", *kept])


def _fail(line: str, status: int) -> NoReturn:
    """Print the run's one error line and exit with ``status`` (a sweep's job keeps the line)."""
    print(f"snapgym: {line}", file=sys.stderr)
    multirun.note_error(line)
    sys.exit(status)


def _show(outcome: Outcome, output_dir: Path) -> None:
    summary_path = outcome.write(output_dir)
    print(outcome.table())
    print(f"\nsummary: {summary_path}")
    if (output_dir / LEDGER_FILE).exists():
        print(f"view it: python -m benchmarks.view {output_dir}")


def one_line(text: str) -> str:
    """``text`` with its line breaks and runs of spaces folded into single spaces."""
    return " ".join(text.split())


def main() -> None:
    """Register the config schemas, check top-level keys, then hand the command line to Hydra."""
    register_configs()
    arguments = sys.argv[1:] = quote_path_arguments(sys.argv[1:])
    try:
        check_top_level_keys(arguments)
        if "--help" in arguments or "-h" in arguments:
            print(help_text([a for a in arguments if a not in ("--help", "-h")]))
            return
        check_choices(arguments)
        check_nested_keys(arguments)
    except ConfigError as exc:
        print(f"snapgym: ConfigError: {exc}", file=sys.stderr)
        sys.exit(EXIT_USAGE)
    _run()
    status, why = multirun.sweep_status()
    if status:
        print(f"snapgym: {why}", file=sys.stderr)
        sys.exit(status)


def check_top_level_keys(arguments: list[str]) -> None:
    """Refuse a ``key=value`` whose top-level key no schema has, suggesting the closest keys.

    Hydra refuses such keys too, but without saying which keys exist.

    Raises:
        ConfigError: naming the key, the closest valid keys, and all of them.
    """
    valid = {f.name for f in dataclasses.fields(RunConfig)} | {"hydra"}
    for argument in arguments:
        if argument.startswith("-") or "=" not in argument or argument[0] in "+~":
            continue
        key = argument.split("=", 1)[0].split(".", 1)[0].split("@", 1)[0]
        if key not in valid:
            close = difflib.get_close_matches(key, sorted(valid), n=3)
            hint = f"did you mean {', '.join(close)}? " if close else ""
            raise ConfigError(f"unknown config key {key!r}; {hint}valid keys: {', '.join(sorted(valid))}")


if __name__ == "__main__":
    main()
