"""Eval: play the suite with the agent and score every episode (the default scenario).

Method:
    The suite's tasks are loaded and their snapshots built (or found in the
    store) before any episode; the agent is constructed first, so a missing
    API key fails before any sandbox starts. ``episodes_per_task`` episodes
    of each task then run, ``pool.size`` at a time, each from its task's
    snapshot (see ``benchmarks.episodes.evaluation``). Every attempt and result is
    appended to ``ledger.jsonl``; infrastructure failures are retried up to
    ``max_attempts``, and outages are waited out up to ``outage_timeout_s``
    (a run stopped by one still writes its summary, then exits non-zero).
    Reported: the outcome counts, mean reward and pass@k by task, reset
    latency (from the environment's ``info``, time to put a sandbox at the
    snapshot) and episode latency percentiles (wall time from
    reset to the verifier's verdict, agent included; numpy, linear
    interpolation), and throughput (finished episodes per second of wall time).
    Nothing is discarded as warm-up: an evaluation reports what it did.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from benchmarks.agents import InstalledAgent, LLMAgent, OracleAgent, make_agent
from benchmarks.attacks import select_attacks
from benchmarks.episodes.attempt import INFRA_ERROR
from benchmarks.episodes.calibration import (
    SHARED_GUARDS,
    TOOLCHAIN_GUARDS,
    calibrate,
    in_mode,
    may_install,
    needs_calibration,
)
from benchmarks.episodes.evaluation import EvalSettings, Evaluation, RunInterruptedError, plan_episodes
from benchmarks.episodes.outage import HealthProbe, OutageError, UnreachableError
from benchmarks.episodes.procs.fleet import Fleet
from benchmarks.episodes.procs.worker import RunSource
from benchmarks.episodes.recording import rundir
from benchmarks.episodes.recording.ledger import Ledger, LedgerWriteError
from benchmarks.episodes.settings import EpisodeSettings
from benchmarks.episodes.sources.routing import RoutedSupply, Supply
from benchmarks.episodes.sources.suites import Suite, image_sources, select_tasks
from benchmarks.episodes.sources.supply import SandboxSupply, open_sandbox_supply
from benchmarks.job import Job, ScenarioStoppedError
from benchmarks.reports import results
from benchmarks.reports.plots import write_plots
from benchmarks.reports.progress import Progress
from benchmarks.schemas import PoolKind
from envs.episode.network import describe_difference, effective_policies, template_for
from envs.episode.taskset import Setup, TaskSet, check_playable
from envs.tasks import Task
from pool.errors import ConfigError, SnapgymError
from pool.network.policy import PhasePolicies
from pool.verification import VerifyMode

SHELL_ENV_ID = "snapgym/Shell-v0"
"""Calibrations play a task's reference solution in the shell environment, whatever the run's."""
log = logging.getLogger(__name__)


@dataclass
class EvalBenchConfig:
    """The eval scenario has no settings of its own: the suite, agent and run settings say it all."""

    name: str = "eval"
    """Scenario name."""
    plots: bool = True
    """Write the PNG plots."""


@dataclass
class EvalOutcome:
    """A finished (or stopped) evaluation's summary."""

    run_dir: Path
    summary: dict[str, Any]

    def write(self, output_dir: Path) -> Path:
        """The files are already in the run directory; returns its summary.json."""
        return self.run_dir / rundir.SUMMARY_FILE

    def table(self) -> str:
        """Per-task table and totals."""
        return results.format_summary(self.summary) + f"\nresults: {self.run_dir}"

    def incomplete(self) -> str | None:
        """Why the run's results are incomplete (episodes left unscored by infrastructure failures past
        their attempts, with the commonest causes), or None."""
        unscored = int(self.summary.get("counts", {}).get("infra_error", 0))
        if not unscored:
            return None
        causes = "; ".join(f"{count}x {_ends(error)}" for error, count in self.summary.get("infra_causes", {}).items())
        return (
            f"{unscored} episode(s) ended unscored by infrastructure failures ({causes}); fix the cause and resume "
            f"the run (python -m benchmarks.run resume={self.run_dir}) to play them again"
        )


def _ends(text: str, keep: int = 200) -> str:
    """A long message as its beginning and end (a build error's cause is in its last lines)."""
    text = " ".join(text.split())
    return text if len(text) <= 2 * keep else f"{text[:keep]} ... {text[-keep:]}"


def run(job: Job) -> EvalOutcome:
    """Run the evaluation the job's config describes; see the module docstring."""
    run_dir, config, resumed = rundir.resolve(job.config, job.output_dir, given=job.given)
    agent = make_agent(_plain(config.agent))
    suite = _suite(config)
    tasks = suite.tasks
    if isinstance(agent, InstalledAgent):  # its install is part of every task's start state
        agent.check_model_key()
        tasks = [agent.with_install(task) for task in tasks]
    return evaluate(job, config, run_dir, tasks, agent, resumed=resumed, plots=config.benchmark.plots,
                    skipped=suite.skipped)  # fmt: skip


def evaluate(
    job: Job,
    config: DictConfig,
    run_dir: Path,
    tasks: list[Task],
    agent: Any,
    *,
    resumed: bool,
    plots: bool,
    skipped: dict[str, str] | None = None,
) -> EvalOutcome:
    """Play the plan into ``run_dir``'s ledger and write its reports (also used by throughput)."""
    settings = dataclasses.replace(eval_settings(config), run_id=run_dir.name)
    _check_processes(settings, config)
    ledger = Ledger.open(run_dir, fsync=config.ledger_fsync)  # first: a second runner of this run stops here
    try:
        supply = open_supply(job, config)
    except UnreachableError as exc:  # a cluster that never answered: stopped like an outage, nothing played
        ledger.close()
        scheduled = len(plan_episodes(tasks, settings.episodes_per_task, settings.seed))
        raise _stopped(exc, run_dir, config, scheduled, agent_name=agent.name, backend=str(config.backend.name),
                       plots=False, extra={"skipped_tasks": skipped or {}}) from exc  # fmt: skip
    except BaseException:
        ledger.close()
        raise
    tasks, unplayable = _playable(tasks, settings, supply)
    tasks, unplaced = _placeable(tasks, supply)
    tasks, uncalibrated = _calibrated(job, config, settings, supply, run_dir, tasks, agent)
    unverifiable = {**unplayable, **unplaced, **uncalibrated}
    skipped = {**(skipped or {}), **unverifiable}
    if not tasks:
        supply.close()
        ledger.close()
        raise ConfigError(f"no task can be verified on this backend: {unverifiable}")
    scheduled = len(plan_episodes(tasks, settings.episodes_per_task, settings.seed))
    final = sum(1 for r in ledger.state.results.values() if r["outcome"] != INFRA_ERROR)  # infra errors run again
    progress = Progress(total=scheduled, done=final, enabled=config.progress,
                        description=config.benchmark.name + (" (resumed)" if resumed else ""))  # fmt: skip
    spread = None
    if settings.processes > 1:
        source = RunSource(job.config, config, job.output_dir, job.overrides, open_supply, health_probes)
        spread = Fleet(source, settings.processes, on_result=progress.update)
    evaluation = Evaluation(tasks, agent, supply, ledger, settings, on_result=progress.update,
                            probes=health_probes(supply, agent), spread=spread)  # fmt: skip
    stopped: SnapgymError | None = None
    try:
        evaluation.run()
    except (OutageError, LedgerWriteError, RunInterruptedError) as exc:
        stopped = exc
    except KeyboardInterrupt:  # while the snapshots were built, before any episode started
        stopped = RunInterruptedError("interrupted before the episodes started")
    except BaseException:
        _close_run(progress, ledger, supply)
        raise
    try:
        return _wrap_up(evaluation, stopped, skipped, progress, ledger, supply, run_dir, config, scheduled, plots)
    except KeyboardInterrupt:  # a (second) Ctrl-C while the sandboxes closed or the summary was written
        raise ScenarioStoppedError("interrupted twice: stopped at once; the ledger holds what finished", None,
                                   run_dir=run_dir, interrupted=True) from None  # fmt: skip


def _wrap_up(
    evaluation: Evaluation, stopped: SnapgymError | None, skipped: dict[str, str] | None, progress: Progress,
    ledger: Ledger, supply: Supply, run_dir: Path, config: DictConfig, scheduled: int, plots: bool,
) -> EvalOutcome:  # fmt: skip
    """After the episodes: close the run's sandboxes and ledger, and write the report (or raise what stopped it)."""
    agent, settings = evaluation.agent, evaluation.settings
    pool_stats = _close_run(progress, ledger, supply)
    extra: dict[str, Any] = {"skipped_tasks": skipped or {}}
    if settings.verification_chosen_by:
        extra["verification_chosen"] = {task: {"verification": settings.verification_chosen.get(task), "chosen_by": why}
                                         for task, why in settings.verification_chosen_by.items()}  # fmt: skip
    if pool_stats:
        extra["pool_stats"] = pool_stats
    if evaluation.outages:
        extra["outages"] = [dataclasses.asdict(outage) for outage in evaluation.outages]
    if stopped is None:
        return report(run_dir, config, scheduled, agent_name=agent.name, backend=supply.name, plots=plots, extra=extra)
    raise _stopped(stopped, run_dir, config, scheduled, agent_name=agent.name, backend=supply.name,
                   plots=plots, extra=extra, final=evaluation.final_results()) from stopped  # fmt: skip


def _close_run(progress: Progress, ledger: Ledger, supply: Supply) -> dict[str, Any]:
    """Close the progress bar, the ledger and the run's sandboxes; the pool's statistics, taken before."""
    try:
        progress.close()
        ledger.close()
        return supply.stats()
    finally:
        with contextlib.suppress(Exception):
            supply.close()


def _stopped(
    stopped: SnapgymError, run_dir: Path, config: DictConfig, scheduled: int, *, agent_name: str, backend: str,
    plots: bool, extra: dict[str, Any], final: int = 0,
) -> ScenarioStoppedError:  # fmt: skip
    """What stops the scenario after ``stopped``, with the run's summary written (when the disk takes it);
    ``final``: the episodes with a final result (an interrupted run's summary says how many)."""
    interrupted = isinstance(stopped, RunInterruptedError)
    if isinstance(stopped, RunInterruptedError) and stopped.at_once:
        return ScenarioStoppedError(f"{stopped}; the ledger holds what finished", None, run_dir=run_dir,
                                    interrupted=True)  # fmt: skip
    reason = f"{type(stopped).__name__}: {stopped}"
    if interrupted:
        reason = f"{stopped}; {final} of {scheduled} episodes have a final result"
        extra["state"] = "interrupted"
    try:
        outcome = report(run_dir, config, scheduled, agent_name=agent_name, backend=backend, plots=plots,
                         extra={**extra, "stopped": reason})  # fmt: skip
    except OSError as exc:  # the disk that refused the ledger may refuse the summary too
        return ScenarioStoppedError(f"{reason} (summary.json could not be written either: {exc})", None,
                                    run_dir=run_dir, interrupted=interrupted)  # fmt: skip
    return ScenarioStoppedError(reason, outcome, run_dir=run_dir, interrupted=interrupted)


def _calibrated(
    job: Job, config: DictConfig, settings: EvalSettings, supply: Supply, run_dir: Path, tasks: list[Task],
    agent: Any,
) -> tuple[list[Task], dict[str, str]]:  # fmt: skip
    """The tasks that calibrate in this environment (those whose mode the calibration chose, in that
    mode), and why each other one is skipped (see :mod:`benchmarks.episodes.calibration`; the oracle
    agent's run is its own calibration, except for the choice of a task's verification mode)."""
    if not settings.calibrate:
        return tasks, {}

    def may_use(mode: VerifyMode) -> Callable[[Task], bool]:
        def offered(task: Task) -> bool:
            strict = settings.verification is None and task.verification is VerifyMode.STRICT
            return strict and mode.value in supply.for_task(task).capabilities.verification

        return offered

    def strict_hint(task: Task) -> bool:
        return (settings.verification or task.verification.value) == VerifyMode.STRICT.value

    choose = settings.calibrate_verification
    wanted = [task for task in tasks if needs_calibration(task, settings.network, verification=settings.verification)]
    if isinstance(agent, OracleAgent):  # only where strict mode may drop what the solution installs
        wanted = [task for task in wanted if strict_hint(task) and may_install(task, settings.network)]
    if not wanted:
        return tasks, {}
    options = {name: value for name, value in (("verification", settings.verification), ("network", settings.network))
               if value is not None}  # fmt: skip
    environment = {
        "backend": supply.name,
        "options": job.backend_options(),
        "verification": options.get("verification"),
        "network": options.get("network"),
    }
    found = calibrate(
        wanted,
        lambda task: supply.make_env(SHELL_ENV_ID, task, **options),
        environment=environment,
        run_dir=run_dir,
        workers=config.pool.size,
        may_share=may_use(VerifyMode.SHARED) if choose else lambda task: False,
        strict_hint=strict_hint,
        guards={attack.name: attack.actions for attack in select_attacks(SHARED_GUARDS)},
        may_toolchain=may_use(VerifyMode.TOOLCHAIN) if choose else lambda task: False,
        toolchain_guards={attack.name: attack.actions for attack in select_attacks(TOOLCHAIN_GUARDS)},
    )
    skipped = {task_id: f"calibration: {c.reason}" for task_id, c in found.items() if not c.ok}
    for task_id, why in skipped.items():
        log.warning("skipping task %s: %s", task_id, why)
    chosen = {task_id: c for task_id, c in found.items() if c.ok and c.chosen_by and c.verification}
    settings.verification_chosen_by.update({task_id: c.chosen_by for task_id, c in chosen.items()})
    settings.verification_chosen.update({task_id: c.verification or "" for task_id, c in chosen.items()})
    return [
        in_mode(task, chosen[task.id].verification or "") if task.id in chosen else task
        for task in tasks
        if task.id not in skipped
    ], skipped


def health_probes(supply: Supply, agent: Any) -> list[HealthProbe]:
    """What every episode of the run depends on: the sandbox supply, and the llm agent's model endpoint."""
    probes: list[HealthProbe] = [supply]
    if isinstance(agent, LLMAgent):
        probes.append(agent.endpoint_probe())
    return probes


def report(
    run_dir: Path, config: DictConfig, scheduled: int, *, agent_name: str, backend: str, plots: bool,
    extra: dict[str, Any] | None = None,
) -> EvalOutcome:  # fmt: skip
    """Tables, summary.json and plots of the run directory's ledger."""
    frame, failed = results.read_run(run_dir)
    meta = {
        "scenario": config.benchmark.name,
        "suite": config.suite.name,
        "agent": agent_name,
        "env_id": eval_settings(config).env_id,
        "backend": backend,
        "pool": config.pool.kind.value if hasattr(config.pool.kind, "value") else str(config.pool.kind),
        "pool_size": config.pool.size,
        **(extra or {}),
    }
    summary = results.summarize_run(run_dir, frame, failed, scheduled=scheduled, ks=list(config.pass_at_k), meta=meta)
    results.write_tables(run_dir, frame, summary)
    if plots:
        write_plots(run_dir, frame)
    return EvalOutcome(run_dir, json.loads(json.dumps(summary, default=str)))


def eval_settings(config: DictConfig) -> EvalSettings:
    """The runner's settings from the config: the episode settings as typed, the rest derived."""
    env = config.env
    episode = {item.name: config[item.name] for item in dataclasses.fields(EpisodeSettings)}
    return EvalSettings(
        **episode,
        env_id=env.value if hasattr(env, "value") else str(env),
        concurrency=config.pool.size,
        processes=config.get("processes", 1),
        verification=_verification(config),
        network=network_setting(config),
    )


def _check_processes(settings: EvalSettings, config: DictConfig) -> None:
    """Refuse worker processes where they cannot help: a Ray pool's sandboxes are not this machine's."""
    kind = config.pool.kind if isinstance(config.pool.kind, PoolKind) else PoolKind[str(config.pool.kind)]
    if settings.processes > 1 and kind is not PoolKind.direct:
        raise ConfigError(
            f"processes={settings.processes} needs pool=direct (each worker process opens its own backend); "
            f"with pool={kind.name} the pool's hosts play the episodes: use processes=1"
        )


def _placeable(tasks: list[Task], supply: Supply) -> tuple[list[Task], dict[str, str]]:
    """The tasks whose GPUs their backend can give, and why each other one is skipped."""
    kept, skipped = [], {}
    for task in tasks:
        served, resources = supply.for_task(task), task.template.resources
        capabilities = served.capabilities
        types = set(resources.gpu_types)
        if resources.gpus and not capabilities.gpu:
            skipped[task.id] = (
                f"asks for {resources.gpus} GPU(s) and the {served.name} backend has none; "
                "run it with gpu_backend='{name: modal}' (or backend=modal)"
            )
        elif resources.gpus and types and capabilities.gpu_types and not types & set(capabilities.gpu_types):
            wanted = "/".join(sorted(types))
            skipped[task.id] = f"asks for a {wanted} GPU, which the {served.name} backend does not offer"
        else:
            kept.append(task)
            continue
        log.warning("skipping task %s: %s", task.id, skipped[task.id])
    return kept, skipped


def _playable(tasks: list[Task], settings: EvalSettings, supply: Supply) -> tuple[list[Task], dict[str, str]]:
    """The tasks their backend can play as the run sets them up, each with its network applied to its
    template, and why each other one is skipped.

    Says, once per distinct change, where the run's ``network`` setting differs from the tasks' own.
    """
    taskset = TaskSet(tasks, verification=settings.verification, network=settings.network, sampler=None)
    kept, skipped = [], {}
    changes: dict[str, list[str]] = {}
    for task in tasks:
        setup = taskset.setup(task)
        reason = _unplayable(task, setup, supply.for_task(task))
        if reason is not None:
            skipped[task.id] = reason
            log.warning("skipping task %s: %s", task.id, reason)
            continue
        kept.append(dataclasses.replace(task, template=template_for(task.template, setup.network)))
        change = describe_difference(task.settings.network, setup.network)
        if change is not None:
            changes.setdefault(change, []).append(task.id)
    for change, ids in changes.items():
        named = ", ".join(ids[:5]) + (f" and {len(ids) - 5} more" if len(ids) > 5 else "")
        message = f"network differs from the task's for {len(ids)} task(s) ({named}): {change}"
        log.warning(message)
        print(f"snapgym: {message}", file=sys.stderr)
    return kept, skipped


def _unplayable(task: Task, setup: Setup, served: SandboxSupply) -> str | None:
    """Why ``served`` cannot play ``task`` as ``setup`` says, or None: the check every environment makes
    (``envs.episode.taskset.check_playable``: verification mode, network modes), and its builds' network."""
    try:
        check_playable(task, setup, served.capabilities, f"the {served.name} backend")
    except ConfigError as exc:
        return str(exc)
    build, modes = setup.network.build.mode.value, served.capabilities.build_network_modes
    if build not in modes:
        return (
            f"its build needs network {build}, which the {served.name} backend's builds do not enforce "
            f"(they enforce {', '.join(modes)})"
        )
    return None


def _verification(config: DictConfig) -> str | None:
    choice = config.get("verification", "task")
    name = choice.value if hasattr(choice, "value") else str(choice)
    return None if name == "task" else name


def network_setting(config: DictConfig) -> Any:
    """The run's ``network`` as plain data (None: each task's own), checked before anything starts."""
    value = config.get("network", "task")
    plain = OmegaConf.to_container(value) if isinstance(value, DictConfig | ListConfig) else value
    if plain is None or plain == "task":
        return None
    effective_policies(PhasePolicies(), plain)  # type: ignore[arg-type]  # a ConfigError names what is wrong
    return plain


def open_supply(job: Job, config: DictConfig) -> Supply:
    """The run's sandboxes: a backend here, or a Ray pool; with ``gpu_backend``, a second one for the
    tasks that ask for GPUs (see benchmarks.episodes.sources.routing)."""
    kind = config.pool.kind if isinstance(config.pool.kind, PoolKind) else PoolKind[str(config.pool.kind)]
    default = open_sandbox_supply(
        kind,
        job.open_backend,
        backend_options=job.backend_options(),
        pool_settings=config.pool,
        backend_name=str(config.backend.name),
    )
    gpu = job.gpu_backend_spec()
    if gpu is None:
        return default
    name, options = gpu
    try:
        routed = open_sandbox_supply(
            kind, lambda: job.open_named_backend(name, options), backend_options=options,
            pool_settings=config.pool, backend_name=name,
        )  # fmt: skip
    except BaseException:
        default.close()
        raise
    return RoutedSupply(default, routed)


def _suite(config: DictConfig) -> Suite:
    suite = config.suite
    return select_tasks(
        suite.path,
        include=list(suite.include),
        exclude=list(suite.exclude),
        limit=suite.limit,
        images=image_sources(list(suite.images)),
        strict=bool(suite.strict),
    )


def _plain(node: Any) -> dict[str, Any]:
    container = OmegaConf.to_container(node, resolve=True)
    assert isinstance(container, dict)
    return {str(k): v for k, v in container.items()}
