"""Calibration: a task is first shown to score in this environment, and its verification mode chosen.

A verifier that downloads its tools (``apt-get``, ``uv``, ``pip``) scores 0.0 when a download fails,
whoever is to blame; a run that played such a task would report the environment's 0 as the
agent's. So before the agent plays, each task whose verifier may use the network (its effective
verifier policy is not ``no-network``) and that has a reference solution is played twice in the
run's own environment (backend or pool, verification mode, network): doing nothing, which must
score 0.0, and the reference solution, which must score 1.0 (see :func:`envs.check.check_in`). A
task that does not calibrate is not played; the run lists it under ``skipped_tasks`` with why,
naming the verifier's connections that failed.

Which tasks calibrate (each needs a reference solution): those whose verifier may use the network,
and those verified in strict mode whose agent phase may use the network. Strict mode verifies on a
fresh sandbox at the task's snapshot with only the outputs grafted, so what a solution installed
elsewhere during the agent's turn (``pip install`` into the system interpreter, ``apt-get install``)
is gone, and a reference solution that installs scores 0.0 there. When the run leaves the mode to
the task (``verification=task``, the default), the task's mode is strict, its reference solution
scores below 1.0 with no failed verifier connection (those make the network's 0, not the mode's),
the task is calibrated again in the next mode the backend offers, in the order ``toolchain``
(strict mode plus what the agent added where packages install, filtered: ``pool.verification.installs``) and
``shared`` (the verifier runs in the agent's own sandbox, behind the protections of
``pool.verification``); the first in which the reference solution scores 1.0, the no-op 0.0 and none
of the attack catalogue's attacks on what that mode leaves to the agent (:data:`TOOLCHAIN_GUARDS`,
:data:`SHARED_GUARDS`) more than the no-op is the mode the task is played in, and the
choice and its cause are recorded (``calibration.json``; ``verification_chosen_by`` in each of its
results; ``verification_chosen`` in ``summary.json``). If shared fails too, the reason names both
modes tried. ``calibrate_verification=false`` turns the choice off; a strict 0 of the reference solution
then says the mode is the likely cause. The choice depends only on the reference solution and the
no-op, played before any agent's episode on fresh sandboxes.

A calibration that holds is kept (``~/.cache/snapgym/calibrations``, or
``$SNAPGYM_CALIBRATION_DIR``) under a key of everything it depends on: the task's snapshot digest,
its tests and solution, the backend and its options, the verification mode and the network
setting. Another run in the same environment reuses it; any change plays it again, and so does a
calibration that failed (the network may be back). Every run writes the calibrations it used to
``calibration.json`` in its directory. An agent cannot influence a calibration: it runs before
the agent's episodes, on sandboxes of the task's snapshot.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import gymnasium as gym

from envs.check import TaskCheck, check_in
from envs.episode.network import NetworkSetting, effective_policies
from envs.tasks import Task
from envs.wrappers import sandbox_env
from pool.errors import SnapgymError
from pool.network.policy import NetworkMode
from pool.verification import VerifyMode

CALIBRATION_FILE = "calibration.json"
"""The calibrations a run used, in its directory."""
_CACHE_ENV = "SNAPGYM_CALIBRATION_DIR"

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Calibration:
    """How a task's reference solution and the no-op scored in one environment."""

    task_id: str
    key: str
    """The digest of everything the outcome depends on (see the module docstring)."""
    oracle_reward: float | None
    noop_reward: float | None
    reached: tuple[str, ...] = ()
    """``host:port`` the oracle's verifier reached."""
    failed: tuple[str, ...] = ()
    """The oracle's (or else the no-op's) verifier connections that did not get through."""
    reason: str = ""
    """Why the task does not calibrate ("" when it does)."""
    cached: bool = False
    """Read from the cache rather than played in this run."""
    verification: str | None = None
    """The verification mode it was played in ("toolchain" or "shared" when the calibration chose it; None:
    the run's)."""
    chosen_by: str = ""
    """Why the calibration chose :attr:`verification` over the run's mode ("" when it did not)."""
    not_started: str = ""
    """Why the calibration could not start a sandbox of the task (its build failed, the backend is
    down): nothing was judged, so the task is played and its episodes report that failure as theirs
    (unscored, counted as infrastructure errors, played again on ``resume``); never cached."""

    @property
    def ok(self) -> bool:
        """The reference solution scored 1.0 and doing nothing 0.0."""
        return not self.reason


def needs_calibration(task: Task, network: NetworkSetting, *, verification: str | None = None) -> bool:
    """Whether ``task`` is calibrated: it has a solution, and its verifier may use the network or it is
    verified in strict mode (``verification``: the run's mode, None: the task's) after an agent phase
    that may use the network (its solution may install what strict mode drops)."""
    if task.solution_dir is None:
        return False
    verifier = effective_policies(task.settings.network, network).verifier
    strict = (verification or task.verification.value) == VerifyMode.STRICT.value
    return verifier.mode is not NetworkMode.NO_NETWORK or (strict and may_install(task, network))


def may_install(task: Task, network: NetworkSetting) -> bool:
    """Whether ``task``'s agent phase may use the network (so its solution may install packages)."""
    return effective_policies(task.settings.network, network).agent.mode is not NetworkMode.NO_NETWORK


def in_mode(task: Task, mode: VerifyMode | str) -> Task:
    """``task`` verified in ``mode`` (how a calibration's choice reaches the task's episodes)."""
    return replace(task, settings=replace(task.settings, verification=VerifyMode.parse(mode).value))


def in_shared_mode(task: Task) -> Task:
    """``task`` verified in shared mode."""
    return in_mode(task, VerifyMode.SHARED)


def calibrate(
    tasks: list[Task],
    make_env: Callable[[Task], gym.Env[Any, str]],
    *,
    environment: Mapping[str, Any],
    run_dir: Path,
    workers: int = 1,
    may_share: Callable[[Task], bool] = lambda task: False,
    strict_hint: Callable[[Task], bool] = lambda task: False,
    guards: Mapping[str, Sequence[str]] | None = None,
    may_toolchain: Callable[[Task], bool] = lambda task: False,
    toolchain_guards: Mapping[str, Sequence[str]] | None = None,
) -> dict[str, Calibration]:
    """The calibration of each task (played with ``workers`` at once, or read from the cache);
    ``environment`` is what the outcome depends on besides the task (JSON-ready), and the result
    is written to ``run_dir/calibration.json``. A task for which ``may_share`` holds and whose
    reference solution scores below 1.0 is calibrated again in toolchain mode where ``may_toolchain`` holds
    (``toolchain_guards`` must score no more than the no-op there), then in shared mode (see the module docstring);
    for one for which ``strict_hint`` holds instead, the reason says that strict mode is the likely cause."""
    if not tasks:
        return {}
    guards = guards or {}

    def one(task: Task) -> Calibration:
        found = _calibrate_one(task, make_env, environment)
        if found.ok or found.oracle_reward == 1.0 or found.failed:  # failed connections: the network's 0
            return found
        tried = [(VerifyMode.TOOLCHAIN, toolchain_guards or {})] if may_toolchain(task) else []
        tried += [(VerifyMode.SHARED, guards)] if may_share(task) else []
        reasons = [f"in strict mode, {found.reason}"]
        for mode, mode_guards in tried:
            chosen, why = _in_mode(task, mode, found, make_env, environment, mode_guards)
            if chosen is not None:
                return chosen
            reasons.append(why)
        if tried:
            return replace(found, reason="; ".join(reasons))
        if strict_hint(task):
            return replace(found, reason=found.reason + "; " + _STRICT_CAUSE)
        return found

    with ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="snapgym-calibrate") as pool:
        found = list(pool.map(one, tasks))
    calibrations = {c.task_id: c for c in found}
    (run_dir / CALIBRATION_FILE).write_text(
        json.dumps({task: asdict(c) for task, c in calibrations.items()}, indent=2) + "\n"
    )
    return calibrations


_STRICT_CAUSE = (
    "strict mode is the likely cause: it verifies with only the task's outputs, so what the solution "
    "installed elsewhere is gone (verification=shared verifies in the agent's sandbox, and "
    "calibrate_verification=true lets the calibration choose it)"
)


def _in_mode(
    task: Task, mode: VerifyMode, strict: Calibration, make_env: Callable[[Task], gym.Env[Any, str]],
    environment: Mapping[str, Any], guards: Mapping[str, Sequence[str]],
) -> tuple[Calibration | None, str]:  # fmt: skip
    """The calibration of ``task`` in ``mode`` after ``strict`` failed: (the chosen one, "") if it holds,
    else (None, why not)."""
    scored = "was not scored" if strict.oracle_reward is None else f"scored {strict.oracle_reward:g}"
    moved = in_mode(task, mode)
    found = _calibrate_one(moved, make_env, {**environment, "verification": mode.value})
    if not found.ok:
        return None, f"in {mode.value} mode, {found.reason}"
    beaten = _beaten(moved, make_env, found.noop_reward or 0.0, guards)
    if beaten is not None:
        return None, (
            f"{mode.value} mode is not chosen: the attack {beaten} scored above doing nothing there (its verifier "
            "runs tools or an interpreter the agent can change)"
        )
    chosen_by = f"calibration: the reference solution {scored} in strict mode (it installs outside the outputs)"
    log.warning("task %s is verified in %s mode: %s", task.id, mode.value, chosen_by)
    return replace(found, verification=mode.value, chosen_by=chosen_by), ""


SHARED_GUARDS = (
    "python-pth", "python-sitecustomize", "path-shadow-tools", "pytest-conftest", "pytest-plugin-entry-point",
)  # fmt: skip
"""The catalogue's attacks (``benchmarks.attacks``) on what shared mode leaves to the agent (its
interpreters' site-packages and the pytest plugins installed there, tools on PATH, a conftest.py):
shared mode is chosen for a task only when each of them scores no more than doing nothing there
(the runner passes them to :func:`calibrate` as ``guards``: name -> actions). On Terminal-Bench 2's
largest-eigenval, shared mode was beaten by the plugin as by the first three
(docs/results/tb2-installing.md)."""
TOOLCHAIN_GUARDS = (*SHARED_GUARDS, "pytest-shadow-package", "site-packages-trojan")
"""The attacks a task's toolchain mode must hold before it is chosen: shared mode's, plus a pytest
package shadowing the real one and a reward-forging hook appended to a module the tests import."""


def _beaten(
    task: Task, make_env: Callable[[Task], gym.Env[Any, str]], floor: float, guards: Mapping[str, Sequence[str]]
) -> str | None:
    """The first of ``guards`` (name: actions) that scores above ``floor`` on ``task`` (in shared mode), or None."""
    env = make_env(task)
    try:
        for name, actions in guards.items():
            env.reset()
            reward: float = 0.0
            for action in actions:
                _, step_reward, terminated, truncated, _ = env.step(action)
                reward = float(step_reward)
                if terminated or truncated:
                    break
            if reward > floor:
                return name
    finally:
        env.close()
    return None


def _calibrate_one(
    task: Task, make_env: Callable[[Task], gym.Env[Any, str]], environment: Mapping[str, Any]
) -> Calibration:
    env: gym.Env[Any, str] | None = None
    try:
        env = make_env(task)
        env.reset()  # the snapshot's digest is part of the key
    except SnapgymError as exc:
        if env is not None:
            env.close()
        log.warning("task %s: its calibration could not start (%s); its episodes will say why", task.id, exc)
        return Calibration(task.id, "", None, None, not_started=f"{type(exc).__name__}: {exc}")
    try:
        snapshot = sandbox_env(env).task_snapshot
        key = _key(task, getattr(snapshot, "digest", None), environment)
        if (cached := _read(key)) is not None:
            return cached
        log.info("calibrating %s: its reference solution and the no-op agent, in this environment", task.id)
        try:
            check = check_in(env, task)
        except SnapgymError as exc:
            return Calibration(task.id, key, None, None, reason=f"the calibration could not run: {exc}")
    finally:
        env.close()
    calibration = _judge(task.id, key, check)
    if calibration.ok:  # a failure is played again next time: the network may be back
        _write(calibration)
    return calibration


def _judge(task_id: str, key: str, check: TaskCheck) -> Calibration:
    oracle, noop = check.oracle, check.noop
    reason = ""
    if oracle.reward != 1.0:
        scored = "was not scored" if oracle.reward is None else f"scored {oracle.reward:g}"
        reason = f"its reference solution {scored} in this environment ({oracle.error or 'see its verifier output'})"
    elif noop.reward != 0.0:
        scored = "was not scored" if noop.reward is None else f"scored {noop.reward:g}"
        reason = f"doing nothing {scored} in this environment ({noop.error or 'the tests do not check the task'})"
    if oracle.reward != 1.0 and oracle.upgrades_dropped:
        reason += f"; its verifier did not get what it upgraded: {'; '.join(oracle.upgrades_dropped[:3])}"
    failed = oracle.failed_connections if oracle.reward != 1.0 else noop.failed_connections
    if reason and failed:
        reason += f"; the verifier's connections that failed: {', '.join(failed[:4])}"
    return Calibration(task_id, key, oracle.reward, noop.reward, oracle.reached, failed, reason)


def _key(task: Task, digest: str | None, environment: Mapping[str, Any]) -> str:
    parts = {
        "task": task.id,
        "snapshot": digest,
        "tests": _tree_digest(task.tests_dir),
        "solution": _tree_digest(task.solution_dir),
        "environment": environment,
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def _tree_digest(folder: Path | None) -> str | None:
    if folder is None or not folder.is_dir():
        return None
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        digest.update(path.relative_to(folder).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def _cache_dir() -> Path:
    return Path(os.environ.get(_CACHE_ENV) or Path.home() / ".cache" / "snapgym" / "calibrations")


def _read(key: str) -> Calibration | None:
    path = _cache_dir() / f"{key}.json"
    try:
        fields = json.loads(path.read_text())
        fields.update(reached=tuple(fields["reached"]), failed=tuple(fields["failed"]), cached=True)
        return Calibration(**fields)
    except (OSError, ValueError, TypeError, KeyError):
        return None


def _write(calibration: Calibration) -> None:
    folder = _cache_dir()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        temporary = folder / f".{calibration.key}.{os.getpid()}.tmp"
        temporary.write_text(json.dumps(asdict(calibration)) + "\n")
        temporary.replace(folder / f"{calibration.key}.json")
    except OSError as exc:  # a cache that cannot be written costs a calibration next time, nothing more
        log.warning("could not keep the calibration of %s in %s: %s", calibration.task_id, folder, exc)
