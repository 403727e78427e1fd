"""Tasks: the built-in suite is solvable and not trivially passed, task directories load or fail clearly,
and the verifier sees tests the agent never could."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import envs
from envs.tasks import BUILTIN_DIR
from pool import LocalBackend
from tests.support.fixtures.envs_fixtures import SOLVE, TASK, write_task

BUILTIN_IDS = envs.builtin_task_ids()


@pytest.fixture(scope="module")
def shell(backend: LocalBackend) -> Iterator[envs.ShellEnv]:
    env = envs.ShellEnv(TASK, backend=backend)
    yield env
    env.close()


# -- the built-in suite -------------------------------------------------------------


def test_the_builtin_suite_has_at_least_20_tasks() -> None:
    """The suite ships at least 20 tasks, each a directory with a task.toml, listed sorted."""
    assert len(BUILTIN_IDS) >= 20, BUILTIN_IDS
    assert sorted(BUILTIN_IDS) == BUILTIN_IDS
    assert TASK in BUILTIN_IDS
    assert all((BUILTIN_DIR / task_id / "task.toml").is_file() for task_id in BUILTIN_IDS)


@pytest.mark.parametrize("task_id", BUILTIN_IDS)
def test_builtin_task_oracle_scores_one_and_noop_scores_zero(backend: LocalBackend, task_id: str) -> None:
    """Every built-in task: the reference solution scores 1.0, the untouched start state 0.0."""
    task = envs.load_task(task_id)
    assert task.solution_dir is not None, f"{task_id} has no solution/solve.sh"
    assert task.instruction.strip()
    check = envs.check_task(backend, task)
    assert check.oracle.reward == 1.0, (check.oracle.error, check.oracle.output[-2000:])
    assert check.noop.reward == 0.0, (check.noop.error, check.noop.output[-2000:])
    assert check.ok


# -- loading ------------------------------------------------------------------------


def test_load_task_by_id_path_or_task(tmp_path: Path) -> None:
    """A task loads by built-in id, by directory (str or Path), and a Task passes through unchanged."""
    by_id = envs.load_task(TASK)
    by_path = envs.load_task(BUILTIN_DIR / TASK)
    by_str = envs.load_task(str(BUILTIN_DIR / TASK))
    assert by_id.id == by_path.id == by_str.id == TASK
    assert by_id.template.content_hash("host") == by_path.template.content_hash("host")
    assert envs.load_task(by_id) is by_id
    mine = envs.load_task(write_task(tmp_path, "my-task"))
    assert mine.id == "my-task" and mine.path == (tmp_path / "my-task").resolve()
    assert mine.workdir == "/app"
    assert mine.instruction == "Create the file /app/done.\n"


def test_load_task_from_the_current_directory_keeps_its_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A task loaded as "." is named after its directory."""
    monkeypatch.chdir(write_task(tmp_path, "here-task"))
    assert envs.load_task(".").id == "here-task"


def test_load_tasks_reads_a_folder_of_tasks(tmp_path: Path) -> None:
    """load_tasks() loads every task directory of a folder, sorted, skipping other entries."""
    write_task(tmp_path, "b-task")
    write_task(tmp_path, "a-task")
    (tmp_path / "notes").mkdir()
    (tmp_path / "README.md").write_text("not a task\n")
    assert [t.id for t in envs.load_tasks(tmp_path)] == ["a-task", "b-task"]
    assert [t.id for t in envs.load_tasks(tmp_path / "a-task")] == ["a-task"]
    with pytest.raises(envs.TaskNotFoundError, match="no task directories"):
        envs.load_tasks(tmp_path / "notes")
    with pytest.raises(envs.TaskNotFoundError, match="no task folder"):
        envs.load_tasks(tmp_path / "missing")


def test_an_unknown_task_id_suggests_a_close_match() -> None:
    """A misspelt id raises TaskNotFoundError (a LookupError and a TaskError) with a suggestion."""
    with pytest.raises(envs.TaskNotFoundError, match="did you mean log-error-count") as raised:
        envs.load_task("log-eror-count")
    assert isinstance(raised.value, LookupError) and isinstance(raised.value, envs.TaskError)
    with pytest.raises(envs.TaskNotFoundError, match=r"built-in ids: .*log-error-count"):
        envs.load_task("zzzzzzzzzzzz")


def test_a_task_spec_of_the_wrong_type_is_a_task_error() -> None:
    """load_task(42) raises TaskError naming the type, not an AttributeError."""
    with pytest.raises(envs.TaskError, match="int"):
        envs.load_task(42)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("task_toml", "field"),
    [
        ('version = "1.0"\n[agent\ntimeout_sec = 1\n', "not valid TOML"),
        ('version = "1.0"\nbogus = 1\n', "bogus"),
        ('version = "1.0"\n[agent]\ntimeout_seconds = 5\n', "agent.timeout_seconds"),
        ('version = "1.0"\n[agent]\ntimeout_sec = "soon"\n', "agent.timeout_sec"),
        ('version = "1.0"\n[verifier]\ntimeout_sec = 0\n', "verifier.timeout_sec"),
        ('version = "1.0"\n[environment]\ncpus = true\n', "environment.cpus"),
        ('version = "1.0"\n[environment]\ngpus = 1.5\n', "environment.gpus"),
        ('version = "1.0"\n[[steps]]\ninstruction = "first"\n', "steps"),
        ('version = "1.0"\n[agent]\nuser = "app"\n', "agent.user"),
        ('version = "1.0"\n[verifier]\nuser = "app"\n', "verifier.user"),
        ('version = "1.0"\n[environment]\nmemory = "lots"\n', "environment.memory"),
        ('version = "1.0"\n[environment]\nallowed_hosts = ["pypi.org"]\n', "environment.allowed_hosts"),
        ('version = "1.0"\n[environment]\nnetwork_mode = "bridge"\n', "environment.network_mode"),
        ('version = "1.0"\n[environment]\nworkdir = "app"\n', "environment.workdir"),
        ('version = "1.0"\n[verifier]\nenv = { A = ["x"] }\n', "verifier.env"),
        ('version = "1.0"\nagent = "fast"\n', "agent"),
        ('schema_version = "1.1"\nartifacts = ["/app/out.log"]\n', "artifacts"),
        ('version = "1.0"\n[environment]\nenv = { T = "${SNAPGYM_TEST_UNSET_VAR}" }\n', "SNAPGYM_TEST_UNSET_VAR"),
    ],
    ids=lambda value: value.splitlines()[-1][:40] if "\n" in value else value,
)
def test_a_malformed_task_toml_is_a_task_error_naming_the_field(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, task_toml: str, field: str
) -> None:
    """Each invalid or unsupported task.toml setting raises TaskError naming task.toml and the field."""
    monkeypatch.delenv("SNAPGYM_TEST_UNSET_VAR", raising=False)
    task = write_task(tmp_path, task_toml=task_toml)
    with pytest.raises(envs.TaskError) as raised:
        envs.load_task(task)
    message = str(raised.value)
    assert "task.toml" in message and field in message, message
    assert not isinstance(raised.value, envs.TaskNotFoundError)


def test_a_harbor_1_1_task_toml_with_no_artifacts_loads(tmp_path: Path) -> None:
    """Harbor's schema 1.1 header as Terminal-Bench 2 tasks now write it (``artifacts = []`` at the top) loads."""
    header = 'schema_version = "1.1"\nartifacts = []\n\n[task]\nname = "terminal-bench/largest-eigenval"\n'
    task = envs.load_task(write_task(tmp_path, task_toml=header + "[environment]\nmemory_mb = 2048\n"))
    assert task.settings.name == "terminal-bench/largest-eigenval"


@pytest.mark.parametrize("missing", ["instruction.md", "tests/test.sh", "task.toml"])
def test_a_task_directory_missing_a_required_file_is_a_task_error(tmp_path: Path, missing: str) -> None:
    """A directory without instruction.md, task.toml or tests/test.sh is not a task; the message names the file."""
    task = write_task(tmp_path)
    (task / missing).unlink()
    with pytest.raises(envs.TaskError, match=f"{missing} is missing"):
        envs.load_task(task)


def test_docker_compose_tasks_are_refused(tmp_path: Path) -> None:
    """A docker-compose environment raises TaskError instead of being half-supported."""
    task = write_task(tmp_path, context={"docker-compose.yaml": "services: {}\n"})
    with pytest.raises(envs.TaskError, match="docker-compose"):
        envs.load_task(task)


def test_a_task_without_a_dockerfile_copies_environment_files_and_runs_setup(
    backend: LocalBackend, tmp_path: Path
) -> None:
    """Without a Dockerfile, environment/ files land in /app and setup.sh runs at build time, then is gone."""
    task = write_task(
        tmp_path,
        dockerfile=None,
        context={"input.txt": "data\n", "setup.sh": "echo prepared > /app/prepared.txt\n"},
    )
    env = envs.ShellEnv(task, backend=backend)
    try:
        env.reset()
        obs, *_ = env.step("pwd; cat input.txt prepared.txt; ls /tmp")
        assert obs["output"] == "/app\ndata\nprepared\n[exit code 0]"
    finally:
        env.close()


# -- what the agent sees and what the verifier sees ----------------------------------------


def test_tests_and_solution_are_absent_during_the_episode(shell: envs.ShellEnv) -> None:
    """The agent can list neither /tests nor /solution, and /logs/verifier does not exist yet."""
    shell.reset()
    for path in ("/tests", "/solution", "/logs/verifier"):
        obs, *_ = shell.step(f"ls {path}")
        assert int(obs["exit_code"]) != 0 and "No such file" in obs["output"], path


def test_tests_are_copied_at_verification_with_their_helpers(backend: LocalBackend, tmp_path: Path) -> None:
    """test.sh finds its helper files under /tests (TEST_DIR) only when the verifier runs."""
    test_sh = (
        "#!/bin/bash\nmkdir -p /logs/verifier\n"
        '[ "$TEST_DIR" = /tests ] && [ -x /tests/check.sh ] && /tests/check.sh && echo 1 > /logs/verifier/reward.txt '
        "|| echo 0 > /logs/verifier/reward.txt\n"
    )
    task = write_task(tmp_path, test_sh=test_sh, tests={"check.sh": "#!/bin/sh\ntest -f /app/done\n"})
    (task / "tests" / "check.sh").chmod(0o755)
    env = envs.ShellEnv(task, backend=backend)
    try:
        env.reset()
        obs, *_ = env.step("ls /tests/check.sh; touch /app/done")
        assert "No such file" in obs["output"]
        _, reward, terminated, _, info = env.step(envs.SUBMIT)
        assert (reward, terminated, info["scored"]) == (1.0, True, True), info["verifier"]
    finally:
        env.close()


def test_a_reward_planted_by_the_agent_is_discarded(shell: envs.ShellEnv) -> None:
    """A reward file the agent writes before submitting is removed before the verifier runs."""
    shell.reset()
    shell.step("mkdir -p /logs/verifier && echo 1 > /logs/verifier/reward.txt && echo '{\"reward\": 1}' > "
               "/logs/verifier/reward.json; mkdir -p /tests && echo 'exit 0' > /tests/test.sh")  # fmt: skip
    _, reward, terminated, _, info = shell.step(envs.SUBMIT)
    assert (reward, terminated, info["scored"]) == (0.0, True, True)


def test_the_agent_cannot_forge_the_reward_by_shadowing_bash(shell: envs.ShellEnv) -> None:
    """A fake bash placed on PATH during the episode does not replace the verifier's interpreter."""
    shell.reset()
    fake = "#!/bin/sh\nmkdir -p /logs/verifier; echo 1 > /logs/verifier/reward.txt\n"
    shell.step(f"mkdir -p /root/.local/bin && printf '%s' '{fake}' > /root/.local/bin/bash && chmod +x "
               "/root/.local/bin/bash")  # fmt: skip
    _, reward, _, _, _ = shell.step(envs.SUBMIT)
    assert reward == 0.0


def test_reward_json_metrics_are_reported(backend: LocalBackend, tmp_path: Path) -> None:
    """reward.json's "reward" is the reward; every numeric metric is in info["verifier"]["rewards"]."""
    test_sh = (
        "#!/bin/bash\nmkdir -p /logs/verifier\n"
        'echo \'{"reward": 0.5, "other": 1, "note": "text"}\' > /logs/verifier/reward.json\n'
    )
    env = envs.ShellEnv(write_task(tmp_path, test_sh=test_sh), backend=backend)
    try:
        env.reset()
        _, reward, terminated, truncated, info = env.step(envs.SUBMIT)
        assert (reward, terminated, truncated) == (0.5, True, False)
        assert info["scored"] is True
        assert info["verifier"]["rewards"] == {"reward": 0.5, "other": 1.0}
    finally:
        env.close()


def test_task_env_reaches_episode_commands_and_verifier_env_the_verifier(
    backend: LocalBackend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """[environment].env (with host ${VAR:-default}) reaches every step; [verifier].env reaches test.sh only."""
    monkeypatch.delenv("SNAPGYM_TEST_UNSET_VAR", raising=False)
    monkeypatch.setenv("SNAPGYM_TEST_SET_VAR", "from-host")
    task_toml = (
        'version = "1.0"\n[environment]\n'
        'env = { GREETING = "${SNAPGYM_TEST_UNSET_VAR:-hello}", ORIGIN = "${SNAPGYM_TEST_SET_VAR}" }\n'
        '[verifier]\nenv = { EXPECTED = "42" }\n'
    )
    test_sh = (
        "#!/bin/bash\nmkdir -p /logs/verifier\n"
        '[ "$(cat /app/out)" = "$EXPECTED" ] && echo 1 > /logs/verifier/reward.txt || echo 0 > '
        "/logs/verifier/reward.txt\n"
    )
    env = envs.ShellEnv(write_task(tmp_path, task_toml=task_toml, test_sh=test_sh), backend=backend)
    try:
        env.reset()
        obs, *_ = env.step('echo "$GREETING $ORIGIN ${EXPECTED-unset}"; echo 42 > /app/out')
        assert obs["output"] == "hello from-host unset\n[exit code 0]"
        _, reward, *_ = env.step(envs.SUBMIT)
        assert reward == 1.0
    finally:
        env.close()


def test_run_solution_copies_and_removes_the_solution(backend: LocalBackend) -> None:
    """run_solution() runs solve.sh from /solution in the workdir and leaves no /solution behind."""
    task = envs.load_task(TASK)
    with backend.create(backend.build(task.template)) as sandbox:
        result = envs.run_solution(sandbox, task)
        assert result.exit_code == 0
        assert sandbox.read_file("/app/answer.txt").strip() == b"127"
        assert sandbox.exec("test -e /solution").exit_code != 0
        verdict = envs.verify(sandbox, task)
        assert verdict.reward == 1.0 and verdict.error is None


def test_a_task_without_a_solution_cannot_run_one(backend: LocalBackend, tmp_path: Path) -> None:
    """run_solution() on a task without solution/solve.sh raises TaskError."""
    task = envs.load_task(write_task(tmp_path, solution=None))
    assert task.solution_dir is None
    with backend.create(backend.build(task.template)) as sandbox, pytest.raises(envs.TaskError, match=r"solve\.sh"):
        envs.run_solution(sandbox, task)


def test_check_task_flags_a_task_that_passes_without_work(backend: LocalBackend, tmp_path: Path) -> None:
    """check_task() is not ok when doing nothing already scores 1.0."""
    always = "#!/bin/bash\nmkdir -p /logs/verifier; echo 1 > /logs/verifier/reward.txt\n"
    check = envs.check_task(backend, envs.load_task(write_task(tmp_path, test_sh=always)))
    assert (check.oracle.reward, check.noop.reward, check.ok) == (1.0, 1.0, False)


def test_solving_log_error_count_by_hand_scores_one(shell: envs.ShellEnv) -> None:
    """The stable task's answer is 127, computable from the log with awk."""
    shell.reset()
    count_5xx = """awk '{ split($0, p, "\\""); split(p[3], f, " "); if (f[1] ~ /^5/) n++ } END { print n }' """
    obs, *_ = shell.step(count_5xx + "access.log")
    assert obs["output"].startswith("127\n")
    shell.step(SOLVE)
    assert shell.step(envs.SUBMIT)[1] == 1.0
