"""The verifier: a trust boundary between what the agent did and the reward it gets.

Harbor's contract, kept: ``tests/`` appears at ``/tests`` only now (the agent
never saw it), ``bash /tests/test.sh`` runs in the task's working directory
with ``[verifier].env`` and ``TEST_DIR=/tests``, and writes a float to
``/logs/verifier/reward.txt`` or a JSON object with a ``"reward"`` key to
``/logs/verifier/reward.json``.

Threat model. The agent is a program optimised for reward: anything it can
touch it will eventually use to raise its reward without doing the task, or to
have its failures not counted. Before the tests run, the sandbox's backend
puts a boundary in place (``sandbox.begin_verification``; the mechanism is in
``pool.verification``), in one of two modes:

``strict`` (the default; every built-in task but the two that test a
service): every process of the agent is gone before the verifier starts, and
the verifier runs in a fresh sandbox at the task's known-good snapshot (with
its own namespaces and its full memory, PID and disk budget) in which only the
task's output directories (``[snapgym] outputs``, default the working
directory) show the agent's end state. The tests' shell, interpreters,
loader, their configuration, PATH and home directories come from the
known-good snapshot; ``/tests`` and ``/logs/verifier`` come from snapgym; a
symbolic link in the outputs that leads into ``/tests``, ``/logs``, ``/proc``
or ``/sys`` is removed (``info["verifier"]["removed_links"]``).

``shared`` (Harbor-compatible; for tests that need a service the agent
started or changes outside the outputs): the agent's processes stay alive and
the verifier sees its whole filesystem, except that the top-level
directories that hold the task's outputs are frozen (shown as the agent's turn
left them, so a process it left running cannot rewrite or swap an answer while
the tests read it; their sockets and FIFOs stay live), links into the private
paths are removed as in strict mode, ``/tests`` and
``/logs/verifier`` are private to the verifier, the top-level links (``/bin``
...), the loader, shell and Python configuration under ``/etc`` and the
dotfiles and ``~/.local`` of ``/root`` come from the known-good snapshot
(``pool.verification.SHARED_HOOKS``), and the agent's processes can neither
trace nor signal the verifier's (Landlock, where the kernel has it:
``backend.capabilities.verifier_isolation``).

In both modes the verifier's environment is built by snapgym (the task's
variables, never the agent's exports: no ``BASH_ENV``, ``LD_PRELOAD`` or
``PYTHON*`` of the agent's), everything test.sh leaves running is killed
before the reward is read, and the reward file is read without following a
link, only if it is a regular file of at most 1 MiB.

What remains possible, by design: the tests read, and often run, the agent's
outputs, so code or configuration in the outputs acts with the verifier's
rights (a module the tests import can write the reward file). Tests must treat
outputs as hostile: decide the reward after the agent's code has finished and
write it last, run agent code in a subprocess, keep the harness's own imports
and tools out of the outputs' reach (``envs/builtin/README.md`` shows how). In
shared mode the agent's live processes can also change any file the verifier
reads outside the frozen outputs and the private paths while it reads it (that
is what shared means: declare what the tests read as outputs),
and programs and libraries the agent could write (a root filesystem's ``/usr``)
are the agent's.

Attribution. Whatever the agent does to its own sandbox (destroy ``/logs``,
fill the disk, exhaust PIDs or inodes, delete the workdir, kill the tests),
the verdict is a score: if test.sh ran and left no valid reward (none, not a
number, not a regular file, too large) or timed out, the reward is 0.0 and
``Verdict.error`` says why. Only a failure of snapgym or the host that the
agent could not cause, raised as a :class:`~pool.errors.SandboxError` (the
verifier's sandbox could not start, its init or the daemon died), leaves the
episode unscored.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import math
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envs.tasks.protect import KnownGood, Protection, protect
from envs.tasks.task import Task
from pool.contract import RunsScripts, Sandbox
from pool.errors import ConfigError, FileOperationError
from pool.network.policy import NetworkPolicy, Phase
from pool.results import ExecResult
from pool.snapshots import Snapshot
from pool.verification import REWARD_DIR, TESTS_PATH, VerificationPlan, VerificationReport, VerifyMode

TESTS_DIR = TESTS_PATH
LOGS_DIR = REWARD_DIR
REWARD_FILES = ("reward.json", "reward.txt")
MAX_REWARD_BYTES = 1 << 20
REPORT_FILES = ("ctrf.json",)
"""Test reports test.sh may leave beside the reward (Terminal-Bench 2's ``pytest --ctrf``), kept with the verdict."""
MAX_REPORT_BYTES = 1 << 20
_MAX_VERIFIER_OUTPUT = 256 * 1024


@dataclass(frozen=True, slots=True)
class Verdict:
    """What the verifier said about an end state."""

    reward: float | None
    """The reward (0.0 when test.sh left no valid one; see ``error``); None only in a Verdict made for an
    infrastructure failure, never by :func:`verify`."""
    rewards: dict[str, float] = field(default_factory=dict)
    """Every metric of reward.json (``{"reward": r}`` for reward.txt)."""
    exit_code: int = 0
    output: str = ""
    """test.sh's stdout and stderr, capped."""
    duration_s: float = 0.0
    timed_out: bool = False
    error: str | None = None
    """Why the reward is 0.0 by rule (no reward file, a bad one, a timeout), or the infrastructure failure."""
    mode: str | None = None
    """The verification mode ("strict", "toolchain" or "shared")."""
    removed_links: tuple[str, ...] = ()
    """strict: links in the outputs that led into the verifier's private paths, removed."""
    missing_outputs: tuple[str, ...] = ()
    """strict: outputs that were not a directory at the end of the episode (the verifier saw them empty)."""
    notes: tuple[str, ...] = ()
    """What the backend said when the verifier's turn began (e.g. why the outputs are empty)."""
    install_delta: dict[str, Any] | None = None
    """toolchain: what the agent installed that the verifier got, and what it did not with the rule
    (:meth:`pool.verification.installs.InstallDelta.as_info`)."""
    reports: dict[str, str] = field(default_factory=dict)
    """The test reports test.sh wrote in the verifier's logs (:data:`REPORT_FILES`), by file name."""
    protected: Protection = field(default_factory=Protection)
    """What of the test infrastructure in the outputs was made the known-good snapshot's (envs.tasks.protect)."""

    def as_info(self) -> dict[str, object]:
        """JSON-ready fields for an episode's ``info``."""
        return {
            "reward": self.reward,
            "rewards": dict(self.rewards),
            "exit_code": self.exit_code,
            "output": self.output,
            "duration_s": self.duration_s,
            "timed_out": self.timed_out,
            "error": self.error,
            "mode": self.mode,
            "removed_links": list(self.removed_links),
            "missing_outputs": list(self.missing_outputs),
            "notes": list(self.notes),
            **({"install_delta": self.install_delta} if self.install_delta is not None else {}),
            "reports": dict(self.reports),
            "protected": self.protected.as_info(),
        }


def plan_for(task: Task, mode: VerifyMode | None = None, *, known_good: Snapshot | None = None) -> VerificationPlan:
    """The verification plan of a task (its own mode unless ``mode`` is given).

    Raises:
        ConfigError: strict verification of a task with no output directory (its workdir is "/"
            and it declares no ``[snapgym] outputs``).
    """
    mode = mode or task.verification
    if mode.is_separate and not task.outputs:
        raise ConfigError(
            f"task {task.id} works in '/', so {mode.value} verification has no output directory to show the verifier; "
            "declare [snapgym] outputs = ['/dir', ...] in its task.toml, or run it with verification='shared'"
        )
    return VerificationPlan(mode, tests_dir=task.tests_dir, outputs=task.outputs, known_good=known_good)


def verify(
    sandbox: Sandbox,
    task: Task,
    *,
    mode: VerifyMode | None = None,
    known_good: Snapshot | None = None,
    env: dict[str, str] | None = None,
    network: NetworkPolicy | None = None,
    protection: KnownGood | None = None,
) -> Verdict:
    """End the agent's turn, run test.sh, and read the reward it wrote.

    The sandbox stays sealed for the verifier until its next ``restore()``.

    Args:
        sandbox: the episode's sandbox, as the agent left it.
        task: the task (its tests, settings and mode).
        mode: overrides the task's verification mode.
        known_good: the snapshot the verifier trusts (the task's); None: the sandbox's start snapshot.
        env: extra variables for test.sh (the task's environment variables, resolved).
        network: the verifier's network policy (None: the sandbox's network is left as the
            boundary left it: loopback only, or nothing through the proxy).
        protection: the known-good test infrastructure of the outputs (envs.tasks.protect), put in
            place before test.sh runs; None: the outputs as the agent left them.

    Raises:
        SandboxError: snapgym or the host failed (an infrastructure failure, not a verdict).
    """
    plan = plan_for(task, mode, known_good=known_good)
    report = sandbox.begin_verification(plan)
    guarded = protect(sandbox, plan.outputs, protection) if protection is not None and plan.outputs else Protection()
    if network is not None:
        sandbox.set_network(network, phase=Phase.VERIFIER)
    result = _run_tests(sandbox, task, verifier_env(task, env))
    return dataclasses.replace(_verdict(sandbox, result, report), protected=guarded)


def _run_tests(sandbox: Sandbox, task: Task, env: dict[str, str]) -> ExecResult:
    """test.sh in the workdir, as in Harbor; from / when the agent deleted it (test.sh still runs and decides).
    Where the sandbox can start bash without a shell in front, it does (the same, one program start less)."""
    test_sh, timeout_s = f"{TESTS_DIR}/test.sh", task.settings.verifier_timeout_s
    if isinstance(sandbox, RunsScripts):
        return sandbox.run_script(test_sh, cwd=task.workdir, timeout_s=timeout_s, env=env,
                                  max_output_bytes=_MAX_VERIFIER_OUTPUT)  # fmt: skip
    return sandbox.exec(
        f"cd -- {shlex.quote(task.workdir)} 2>/dev/null || cd /\n{run_script_command(test_sh)}",
        timeout_s=timeout_s, cwd="/", env=env, max_output_bytes=_MAX_VERIFIER_OUTPUT,
    )  # fmt: skip


def verifier_env(task: Task, extra: dict[str, str] | None = None) -> dict[str, str]:
    """test.sh's environment: the task's variables and TEST_DIR, never anything the agent exported."""
    return {"TEST_DIR": TESTS_DIR, **task.settings.environment.env, **task.settings.verifier_env, **(extra or {})}


def _verdict(sandbox: Sandbox, result: ExecResult, report: VerificationReport) -> Verdict:
    if result.timed_out:
        rewards: dict[str, float] = {}
        error: str | None = f"test.sh timed out after {result.duration_s:.0f} s (scored 0.0)"
    else:
        rewards, error = _read_rewards(sandbox)
    return Verdict(
        reports=_read_reports(sandbox),
        reward=rewards.get("reward", 0.0) if error is None else 0.0,
        rewards=rewards,
        exit_code=result.exit_code,
        output=(result.stdout + result.stderr)[-_MAX_VERIFIER_OUTPUT:],
        duration_s=result.duration_s,
        timed_out=result.timed_out,
        error=error,
        mode=report.mode.value,
        removed_links=report.removed_links,
        missing_outputs=report.missing_outputs,
        notes=report.notes,
        install_delta=None if report.install_delta is None else report.install_delta.as_info(),
    )


def _read_rewards(sandbox: Sandbox) -> tuple[dict[str, float], str | None]:
    for name, parse in (("reward.json", _parse_reward_json), ("reward.txt", _parse_reward_txt)):
        path = f"{LOGS_DIR}/{name}"
        try:
            raw = sandbox.read_file(path, max_bytes=MAX_REWARD_BYTES, follow_symlinks=False)
        except FileOperationError as exc:
            if exc.errno == errno.ENOENT:
                continue
            return {}, f"{path} is not a readable regular file of at most {MAX_REWARD_BYTES} bytes: " \
                       f"{exc.strerror} (scored 0.0)"  # fmt: skip
        rewards, error = parse(raw)
        return rewards, None if error is None else f"{error} (scored 0.0)"
    return {}, f"test.sh wrote neither {LOGS_DIR}/reward.txt nor reward.json (scored 0.0)"


def _read_reports(sandbox: Sandbox) -> dict[str, str]:
    """The test reports test.sh left, as text; one that is missing, not a regular file or too big is skipped."""
    reports = {}
    for name in REPORT_FILES:
        try:
            raw = sandbox.read_file(f"{LOGS_DIR}/{name}", max_bytes=MAX_REPORT_BYTES, follow_symlinks=False)
        except FileOperationError:
            continue
        reports[name] = raw.decode("utf-8", errors="replace")
    return reports


def _parse_reward_json(raw: bytes) -> tuple[dict[str, float], str | None]:
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return {}, f"reward.json is not JSON: {raw[:200]!r}"
    if not isinstance(data, dict) or "reward" not in data:
        return {}, "reward.json must be an object with a 'reward' key"
    values = {str(k): v for k, v in data.items() if isinstance(v, int | float) and not isinstance(v, bool)}
    if "reward" not in values or not all(math.isfinite(v) for v in values.values()):
        return {}, f"reward.json holds a non-numeric or non-finite reward: {data.get('reward')!r}"
    return {k: float(v) for k, v in values.items()}, None


def _parse_reward_txt(raw: bytes) -> tuple[dict[str, float], str | None]:
    try:
        reward = float(raw.decode().strip())
    except (ValueError, UnicodeDecodeError):
        return {}, f"reward.txt does not hold a number: {raw[:200]!r}"
    if not math.isfinite(reward):
        return {}, f"reward.txt holds a non-finite number: {reward}"
    return {"reward": reward}, None


def run_script_command(path: str) -> str:
    """``/bin/bash path`` (or ``sh`` on a base without bash).

    The shell is named by absolute path; in the verifier's sandbox ``/bin``
    and the shell come from the known-good snapshot.
    """
    return f"if [ -x /bin/bash ]; then exec /bin/bash {path}; else exec /bin/sh {path}; fi"


def copy_dir_into(sandbox: Sandbox, source: Path, dest: str) -> None:
    """Copy a host folder's files into the sandbox, keeping modes."""
    for item in sorted(source.rglob("*")):
        if item.is_file():
            relative = item.relative_to(source).as_posix()
            sandbox.write_file(f"{dest}/{relative}", item.read_bytes(), mode=item.stat().st_mode & 0o777)
