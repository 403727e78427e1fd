"""The documentation's code runs as written: every Python block of the README and of ``docs/**/*.md`` is
executed in a fresh interpreter, and every ``python -m benchmarks.run`` command line of their shell blocks
composes into a valid config (the same checks the command makes before any sandbox starts), so neither can
rot. Each test's id names the file and the line its block starts on."""

from __future__ import annotations

import contextlib
import importlib.util
import itertools
import os
import re
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from benchmarks.api import checked_config
from benchmarks.cli import config_overrides
from tests.support.needs import needs
from tests.support.servers.chat_server import ChatServer

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()
DOCUMENTS = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
NO_TRAIN_EXTRA = importlib.util.find_spec("trl") is None
_FENCE = re.compile(r"^( *)```(\w*)\n(.*?)^\1```", re.M | re.S)


def blocks(language: str) -> list[tuple[str, int, str]]:
    """The fenced blocks in ``language`` (indented ones too) of every document: (file, first line, code)."""
    found = []
    for path in DOCUMENTS:
        text = path.read_text()
        for match in _FENCE.finditer(text):
            if match.group(2) == language:
                line = text.count("\n", 0, match.start()) + 2
                found.append((path.relative_to(REPO).as_posix(), line, textwrap.dedent(match.group(3))))
    return found


def python_params() -> list[Any]:
    """One test per Python block; those that start Ray or need a Docker engine are marked."""
    params = []
    for name, line, code in blocks("python"):
        marks = [pytest.mark.slow] if "SandboxPool(" in code else []
        if "envs.train" in code:  # trains or samples a model: the train extra (docs/training.md)
            marks = [pytest.mark.slow, needs(NO_TRAIN_EXTRA, "the train extra is missing: pip install '.[train]'")]
        params.append(pytest.param(code, id=f"{name}:{line}", marks=marks))
    return params


def run_lines() -> list[tuple[str, list[str]]]:
    """Each ``python -m benchmarks.run`` line of the shell blocks: (file:line, its arguments)."""
    found = []
    for name, start, code in blocks("bash"):
        for offset, text in enumerate(code.splitlines()):
            command = text.split("  #", 1)[0].strip()
            words = shlex.split(command, comments=True) if "benchmarks.run" in command else []
            if words:  # bash expands a ~ after "NAME=" (not after suite.path=: the runner does); shlex does not
                words = [re.sub(r"^([A-Za-z_]\w*)=~/", rf"\1={Path.home()}/", word, count=1) for word in words]
                found.append((f"{name}:{start + offset}", words[words.index("benchmarks.run") + 1 :]))
    return found


def expand_sweeps(arguments: list[str]) -> list[list[str]]:
    """A multirun's command line as the single runs it sweeps (``pool.size=1,2`` gives two)."""
    overrides = [a for a in arguments if a != "-m"]
    choices = []
    for override in overrides:
        key, _, value = override.partition("=")
        is_sweep = "," in value and not value.startswith(("[", "{", "'", '"'))
        choices.append([f"{key}={v}" for v in value.split(",")] if is_sweep else [override])
    return [list(combination) for combination in itertools.product(*choices)]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("code", python_params())
def test_python_block_runs_as_written(code: str, tmp_path: Path) -> None:
    if 'backend="docker"' in code:
        from tests.support.backends import need_backend

        need_backend("docker")
    env = dict(os.environ)
    with contextlib.ExitStack() as stack:
        if "OPENAI_BASE_URL" in code:  # a model's policy: a local stand-in answers (tests/agents/test_own_agent.py)
            server = ChatServer(["```bash\nls\n```"])
            server.start()
            stack.callback(server.close)
            env.update(OPENAI_BASE_URL=server.base_url, OPENAI_API_KEY="stand-in-key")
        done = subprocess.run(
            [sys.executable, "-c", code],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=540,
            check=False,
        )
    assert done.returncode == 0, f"{code}\n--- stderr ---\n{done.stderr[-4000:]}"


@pytest.mark.parametrize(("where", "arguments"), run_lines(), ids=[where for where, _ in run_lines()])
def test_run_command_line_composes(where: str, arguments: list[str]) -> None:
    for overrides in expand_sweeps(arguments):
        checked_config(config_overrides(overrides))


def test_every_module_the_shell_blocks_run_exists() -> None:
    modules = {m for _, _, code in blocks("bash") for m in re.findall(r"python -m ([\w.]+)", code)} - {"pip", "pytest"}
    assert modules, "no python -m lines found: the block parser is broken"
    if NO_TRAIN_EXTRA:  # envs.train refuses to import without its extra, in one line that names it
        modules = {m for m in modules if not m.startswith("envs.train")}
    assert [m for m in sorted(modules) if importlib.util.find_spec(m) is None] == []


def test_the_quickstart_is_two_commands_install_and_run_then_test() -> None:
    quickstart = README.split("## Quickstart", 1)[1].split("##", 1)[0]
    commands = [line for line in _FENCE.search(quickstart).group(3).splitlines() if line.strip()]  # type: ignore[union-attr]
    assert commands == ["pip install -e . && python -m benchmarks.run", "pip install -e '.[dev]' && python -m pytest"]


def test_the_docs_blocks_are_collected_too() -> None:
    names = {name for language in ("python", "bash") for name, _, _ in blocks(language)}
    assert "README.md" in names
    assert any(name.startswith("docs/") for name in names), "no block of docs/ found: the document list is broken"


def test_the_readme_is_a_front_door() -> None:
    assert len(README.splitlines()) <= 400, "the README links into docs/; move detail there"
