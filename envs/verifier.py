"""Run a task's tests in the sandbox at the end of an episode and read the reward.

Harbor's contract: ``tests/`` is copied to ``/tests`` only now (the agent never
saw it), ``bash /tests/test.sh`` runs in the task's working directory with
``[verifier].env`` and ``TEST_DIR=/tests``, and writes a float to ``/logs/verifier/reward.txt`` or a
JSON object with a ``"reward"`` key to ``/logs/verifier/reward.json``.

Verification runs without network, like the episode. A test.sh that installs
its tools at verification time (``curl ... | sh``, ``pip install pytest``)
fails here: install them at build time instead, with a ``RUN`` line in the
Dockerfile or ``[snapgym] verifier_setup`` in task.toml.
"""

from __future__ import annotations

import errno
import json
import math
import secrets
from dataclasses import dataclass, field
from pathlib import Path

from envs.tasks import Task
from pool.contract import Sandbox
from pool.errors import FileOperationError
from pool.results import ExecResult

TESTS_DIR = "/tests"
LOGS_DIR = "/logs/verifier"
REWARD_FILES = ("reward.json", "reward.txt")
_NO_MV = "snapgym: this image has no mv"
_MAX_VERIFIER_OUTPUT = 256 * 1024


@dataclass(frozen=True, slots=True)
class Verdict:
    """What the verifier said about an end state."""

    reward: float | None
    """The reward, or None when the verifier produced none (see ``error``)."""
    rewards: dict[str, float] = field(default_factory=dict)
    """Every metric of reward.json (``{"reward": r}`` for reward.txt)."""
    exit_code: int = 0
    output: str = ""
    """test.sh's stdout and stderr, capped."""
    duration_s: float = 0.0
    timed_out: bool = False
    error: str | None = None
    """Why there is no reward: a verifier problem, never the agent's score."""

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
        }


def verify(sandbox: Sandbox, task: Task, *, env: dict[str, str] | None = None) -> Verdict:
    """Copy the tests in, run test.sh, and read the reward it wrote.

    Raises:
        SandboxError: the sandbox failed (an infrastructure failure, not a verdict).
    """
    # The tests go to a folder the agent cannot have prepared and replace /tests in the same exec
    # that clears stale rewards and starts test.sh; [ -e ] tests are builtins, so the usual case
    # costs one process (mv) before test.sh. An image without mv gets the two-exec way.
    staging = f"/.snapgym-tests-{secrets.token_hex(8)}"
    copy_dir_into(sandbox, task.tests_dir, staging)
    sandbox.write_file(f"{LOGS_DIR}/.snapgym", b"")  # creates the folder test.sh writes into
    prepare = (
        f"command -v mv >/dev/null 2>&1 || {{ echo '{_NO_MV}' >&2; exit 97; }}\n"
        f"{{ [ ! -e {TESTS_DIR} ] || rm -rf {TESTS_DIR}; }}"
        + "".join(f" && {{ [ ! -e {LOGS_DIR}/{name} ] || rm -rf {LOGS_DIR}/{name}; }}" for name in REWARD_FILES)
        + f" && mv {staging} {TESTS_DIR} || {{ echo 'snapgym: could not install the tests' >&2; exit 97; }}"
    )
    result = _run_tests(sandbox, task, prepare, env)
    if result.exit_code == 97 and result.stderr.startswith(_NO_MV):
        sandbox.exec(f"rm -rf {staging} {TESTS_DIR} {LOGS_DIR} && mkdir -p {TESTS_DIR} {LOGS_DIR}", timeout_s=60)
        copy_dir_into(sandbox, task.tests_dir, TESTS_DIR)
        result = _run_tests(sandbox, task, "true", env)
    return _verdict(sandbox, result)


def _run_tests(sandbox: Sandbox, task: Task, prepare: str, env: dict[str, str] | None) -> ExecResult:
    return sandbox.exec(
        f"{prepare}\n{run_script_command(f'{TESTS_DIR}/test.sh')}",
        timeout_s=task.settings.verifier_timeout_s,
        cwd=task.workdir,
        env={"TEST_DIR": TESTS_DIR, **task.settings.environment.env, **task.settings.verifier_env, **(env or {})},
        max_output_bytes=_MAX_VERIFIER_OUTPUT,
    )


def _verdict(sandbox: Sandbox, result: ExecResult) -> Verdict:
    if result.timed_out:
        rewards: dict[str, float] = {}
        error: str | None = f"test.sh timed out after {result.duration_s:.0f} s"
    else:
        rewards, error = _read_rewards(sandbox)
    return Verdict(
        reward=rewards.get("reward") if error is None else None,
        rewards=rewards,
        exit_code=result.exit_code,
        output=(result.stdout + result.stderr)[-_MAX_VERIFIER_OUTPUT:],
        duration_s=result.duration_s,
        timed_out=result.timed_out,
        error=error,
    )


def _read_rewards(sandbox: Sandbox) -> tuple[dict[str, float], str | None]:
    json_raw = _read_if_present(sandbox, f"{LOGS_DIR}/reward.json", 1 << 20)
    if json_raw is not None:
        return _parse_reward_json(json_raw)
    text_raw = _read_if_present(sandbox, f"{LOGS_DIR}/reward.txt", 4096)
    if text_raw is not None:
        return _parse_reward_txt(text_raw)
    return {}, f"test.sh wrote neither {LOGS_DIR}/reward.txt nor reward.json"


def _read_if_present(sandbox: Sandbox, path: str, max_bytes: int) -> bytes | None:
    try:
        return sandbox.read_file(path, max_bytes=max_bytes)
    except FileOperationError as exc:
        if exc.errno == errno.ENOENT:
            return None
        raise


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

    The shell is named by absolute path: a ``bash`` the agent put earlier on
    PATH (``~/.local/bin``) must not run the verifier. Tools the script itself
    finds on PATH are another matter; see the README on tampering.
    """
    return f"if [ -x /bin/bash ]; then exec /bin/bash {path}; else exec /bin/sh {path}; fi"


def copy_dir_into(sandbox: Sandbox, source: Path, dest: str) -> None:
    """Copy a host folder's files into the sandbox, keeping modes."""
    for item in sorted(source.rglob("*")):
        if item.is_file():
            relative = item.relative_to(source).as_posix()
            sandbox.write_file(f"{dest}/{relative}", item.read_bytes(), mode=item.stat().st_mode & 0o777)
