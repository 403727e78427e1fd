"""The runner's command line as users type it: ``~`` and relative paths, a folder with broken tasks,
and a mistyped choice of a config group (one line, exit 2)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TRIVIAL = REPO / "benchmarks" / "tasks" / "trivial"
EXIT_USAGE = 2


def run_typed(*arguments: str, cwd: Path = REPO, home: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m benchmarks.run ARGUMENTS`` from ``cwd``, as a shell passes them (no ``~`` expanded)."""
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    if home is not None:
        env["HOME"] = str(home)
    return subprocess.run(
        [sys.executable, "-m", "benchmarks.run", *arguments],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )


@pytest.mark.parametrize(
    ("argument", "line"),
    [
        ("backend=dockr", "unknown backend 'dockr'; did you mean docker? (daytona, docker, e2b, local, modal)"),
        ("agent=orcale", "unknown agent 'orcale'; did you mean oracle? (claude-code, codex, installed, llm, noop, "
                         "oracle, python, replay)"),
        ("pool=rey", "unknown pool 'rey'; did you mean ray? (direct, ray)"),
        ("suite=dri", "unknown suite 'dri'; did you mean dir? (builtin, dir)"),
        ("benchmark=zzz", "unknown benchmark 'zzz'; choose one of: aio, burst, cost, durable, egress, eval, fork, "
                          "idle, integrity, pool, reset_latency, soak, throughput"),
    ],
)  # fmt: skip
def test_a_mistyped_choice_is_one_line_and_exit_2(argument: str, line: str) -> None:
    done = run_typed(argument, "--cfg", "job")
    assert done.returncode == EXIT_USAGE, done.stderr
    assert done.stderr.strip() == f"snapgym: ConfigError: {line}"


def test_a_mistyped_choice_in_a_sweep_is_refused_before_any_job() -> None:
    done = run_typed("-m", "backend=local,dockr", "--cfg", "job")
    assert done.returncode == EXIT_USAGE, done.stderr
    assert done.stderr.strip().startswith("snapgym: ConfigError: unknown backend 'dockr'; did you mean docker?")


def test_tilde_paths_pass_hydra_grammar_bare_and_in_lists() -> None:
    done = run_typed(
        "suite=dir", "suite.path=~/terminal-bench/tasks", "backend.store_dir=~/store",
        "backend.egress.extra_ca_files=[~/a.crt,/etc/b.crt]", "suite.images=[python:3.13=docker-archive:~/py.tar]",
        "--cfg", "job",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "path: ~/terminal-bench/tasks" in done.stdout
    assert "- ~/a.crt" in done.stdout and "- /etc/b.crt" in done.stdout


@pytest.fixture
def home_with_tasks(tmp_path: Path) -> Path:
    """A home folder holding ``tasks/``: one good task, one with a broken task.toml, one with RUN --mount."""
    home = tmp_path / "home"
    tasks = home / "tasks"
    shutil.copytree(TRIVIAL, tasks / "good")
    shutil.copytree(TRIVIAL, tasks / "broken-toml")
    (tasks / "broken-toml" / "task.toml").write_text("version = [\n")
    shutil.copytree(TRIVIAL, tasks / "mount")
    (tasks / "mount" / "environment" / "Dockerfile").write_text(
        "FROM python:3.13-slim\nRUN --mount=type=cache,target=/root/.cache pip install requests\n"
    )
    return home


def test_a_tilde_suite_runs_its_good_tasks_and_lists_the_invalid_ones(home_with_tasks: Path, tmp_path: Path) -> None:
    here = tmp_path / "here"
    here.mkdir()
    done = run_typed(
        "suite=dir", "suite.path=~/tasks", "agent=noop", "backend.store_dir=~/store", "output_dir=out",
        cwd=here, home=home_with_tasks,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "snapgym: skipping 2 invalid task(s)" in done.stderr
    assert "  broken-toml: invalid task: TaskError:" in done.stderr
    assert "  mount: invalid task: DockerfileError:" in done.stderr and "RUN --mount" in done.stderr
    summary = json.loads((here / "out" / "summary.json").read_text())  # output_dir relative to where it ran
    assert set(summary["skipped_tasks"]) == {"broken-toml", "mount"}
    assert summary["counts"]["scored"] == 1
    assert (home_with_tasks / "store").is_dir()  # backend.store_dir=~/store went to $HOME


def test_suite_strict_stops_on_the_first_invalid_task_and_says_how_to_skip_it(
    home_with_tasks: Path, tmp_path: Path
) -> None:
    done = run_typed("suite=dir", "suite.path=tasks", "suite.strict=true", "agent=noop", cwd=home_with_tasks)
    assert done.returncode == EXIT_USAGE, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("snapgym: TaskError: task broken-toml: ")
    assert "suite.exclude=[broken-toml]" in lines[0] and "drop suite.strict" in lines[0]
