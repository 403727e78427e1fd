"""Real coding agents (Claude Code and Codex CLI, from npm) installed into a task's snapshot and run
inside the sandbox by the real runner, talking to a stand-in model through the model gateway, with
their key outside.

The CLIs come from their registry (npm); a machine that cannot reach it skips these tests and says
so. The model is ``model_fixtures``' stand-in on the test internet, scripted to solve the built-in
task: it answers the agent's first call with a tool call that solves it (Claude Code's ``Bash``,
Codex's ``exec_command``), and the next with "done". What is checked is what a user relies on: the
reward comes from the verifier (1.0), the key never reaches the sandbox or the run's files, every
call and its tokens are on record, the agent's own log is in the episode's folder, and a model that
is down is an infrastructure failure, not the agent's.
"""

from __future__ import annotations

import ipaddress
import json
import os
import socket
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from benchmarks.agents.installed import INSTRUCTION_FILE, LOGS_DIR, collect_logs
from benchmarks.episodes.recording.episodefiles import write_agent_files
from pool import Backend, Sandbox, Snapshot
from tests.support.fixtures.model_fixtures import KEY_VARIABLE, NAME, StandInModel
from tests.support.fixtures.net_fixtures import TestInternet
from tests.support.fixtures.runner_fixtures import SOLVE, Run, run_benchmark
from tests.support.needs import skip_missing

pytest_plugins = [
    "tests.support.fixtures.net_fixtures",
    "tests.support.fixtures.model_fixtures",
    "tests.support.fixtures.runner_fixtures",
]

CLAUDE_CODE = "@anthropic-ai/claude-code@2.1.332"
"""The version configs/agent/claude-code.yaml pins."""


@dataclass(frozen=True)
class CLI:
    """An installed agent as the tests drive it."""

    config: str
    """Its ``agent=`` choice."""
    version: str
    route: str
    """The model route it calls through."""
    path: str
    """The API path of its calls."""
    tool: dict[str, Any]
    """The scripted model's tool call that solves the task."""
    log: str
    """Its own log, under the episode's agent/logs/."""
    log_mark: str
    """What its log says when it ran the tool."""


CLIS = [
    CLI("claude-code", "2.1.332", "anthropic", "/v1/messages",
        {"name": "Bash", "input": {"command": SOLVE, "description": "count 5xx"}}, "claude-code.jsonl", '"tool_use"'),
    CLI("codex", "0.171.0", "openai", "/v1/responses",
        {"name": "exec_command", "input": {"cmd": SOLVE}}, "codex.jsonl", '"command_execution"'),
]  # fmt: skip
INSTALL_TIMEOUT_S = 900


@pytest.fixture(scope="module")
def npm_registry() -> None:
    """Skip unless npm can reach its registry from here (the CLI is installed from it, as its vendor says)."""
    try:
        done = subprocess.run(["npm", "view", CLAUDE_CODE, "version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        skip_missing(f"npm cannot reach its registry here ({exc}); Claude Code cannot be installed")
    if done.returncode != 0:
        skip_missing(f"npm cannot reach its registry here: {done.stderr.strip()[-300:]}")


@pytest.fixture()
def sandbox_for_logs(backend: Backend, snap: Snapshot) -> Iterator[Sandbox]:
    with backend.create(snap) as sandbox:
        yield sandbox


def registry_networks() -> list[str]:
    """The npm registry's addresses when they are not global (a mirror on a private or reserved network,
    as on the machines this project is built on): the egress proxy refuses those unless trusted."""
    try:
        found = {info[4][0] for info in socket.getaddrinfo("registry.npmjs.org", 443, type=socket.SOCK_STREAM)}
    except OSError:
        return []
    return [f"{address}/{32 if ':' not in address else 128}" for address in sorted(found)
            if not ipaddress.ip_address(address).is_global]  # fmt: skip


@pytest.fixture(scope="module")
def agent_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The module's snapshot store: the task with Claude Code installed is built once."""
    return tmp_path_factory.mktemp("agent-store")


def cli_run(
    tmp_path: Path,
    store: Path,
    internet: TestInternet,
    model: StandInModel,
    *overrides: str,
    agent: str = "claude-code",
    name: str = "run",
) -> Run:
    """The runner playing the task with an installed agent, its model route pointed at the stand-in."""
    hosts = [f"{host}={address}" for host, address in {**internet.hosts, NAME: model.address}.items()]
    return run_benchmark(
        tmp_path,
        store,
        f"agent={agent}",
        "agent.model=stand-in-model",
        f"agent.model_route.upstream={model.url}",
        f"agent.model_route.credential_env={KEY_VARIABLE}",
        f"backend.egress.hosts=[{','.join(json.dumps(h) for h in hosts)}]",
        f"backend.egress.trusted_networks=[{','.join([internet.network, *registry_networks()])}]",
        f"backend.egress.extra_ca_files=[{internet.ca.cert_path}]",
        *overrides,
        env={**os.environ, KEY_VARIABLE: model.api_key},
        name=name,
        timeout_s=INSTALL_TIMEOUT_S,
    )


def every_file_text(folder: Path) -> str:
    return "\n".join(p.read_bytes().decode("utf-8", "replace") for p in folder.rglob("*") if p.is_file())


@pytest.mark.parametrize(
    "cli",
    [pytest.param(c, id=c.config, marks=[pytest.mark.slow] if c.config == "codex" else []) for c in CLIS],
)  # Codex in the slow suite (CI runs both): the default run stays well under 15 minutes
def test_a_cli_agent_installed_in_the_snapshot_solves_the_task_with_its_key_outside(
    npm_registry: None, internet: TestInternet, model_api: StandInModel, agent_store: Path, tmp_path: Path, cli: CLI
) -> None:
    model_api.script({"tool": cli.tool}, {"text": "The answer is in /app/answer.txt."})
    before = len(model_api.requests())
    run = cli_run(tmp_path, agent_store, internet, model_api, agent=cli.config)
    summary = run.summary()
    result = run.result()
    assert (result["outcome"], result["reward"]) == ("scored", 1.0), result
    assert result["agent"] == f"{cli.config}@{cli.version}:stand-in-model"  # the pinned version, in every result
    calls = [c for c in model_api.requests()[before:] if c["method"] == "POST"]
    assert len(calls) >= 2 and all(c["path"].startswith(cli.path) for c in calls)
    assert all(model_api.api_key in (c["headers"].get("x-api-key"), c["headers"].get("authorization", "")[7:])
               for c in calls)  # fmt: skip
    assert calls[0]["body"]["model"] == "stand-in-model"
    model = result["network"]["model"]
    assert model["calls"] >= len(calls) and model["routes"][cli.route]["input_tokens"] >= 11 * len(calls)
    folder = run.run_dir / result["files"]["dir"]
    log = (folder / "agent/logs" / cli.log).read_text()
    assert cli.log_mark in log and "answer.txt" in log  # the agent's own trajectory, copied out
    network = json.loads((folder / "network.json").read_text())
    assert {c["path"] for c in network["model_calls"] if c["method"] == "POST"} == {cli.path}
    assert model_api.api_key not in every_file_text(run.run_dir)  # nor in the ledger, the files, the config
    assert summary["counts"]["scored"] == 1


TOKEN_FIELDS = ("prompt_token_ids", "completion_token_ids", "logprobs")


def test_claude_code_on_an_inference_server_keeps_every_calls_tokens_as_the_server_sent_them(
    npm_registry: None, internet: TestInternet, model_api: StandInModel, agent_store: Path, tmp_path: Path
) -> None:
    """The route translates Claude Code's Messages to Chat Completions (as vLLM serves them) and captures
    each call's token ids and log-probabilities; Claude Code sees plain Anthropic messages."""
    cli = CLIS[0]
    model_api.script({"tool": cli.tool}, {"text": "The answer is in /app/answer.txt."})
    sent_before, asked_before = len(model_api.sent_tokens()), len(model_api.requests())
    run = cli_run(
        tmp_path, agent_store, internet, model_api,
        "+agent.model_route.capture_tokens=true", "+agent.model_route.upstream_api=openai",
    )  # fmt: skip
    result = run.result()
    assert (result["outcome"], result["reward"]) == ("scored", 1.0), result
    upstream = [r for r in model_api.requests()[asked_before:] if r["method"] == "POST"]
    assert len(upstream) >= 2 and all(r["path"] == "/v1/chat/completions" for r in upstream)
    assert all(r["body"]["logprobs"] is True and r["body"]["return_token_ids"] is True for r in upstream)
    sent = model_api.sent_tokens()[sent_before:]
    folder = run.run_dir / result["files"]["dir"]
    lines = [json.loads(line) for line in (folder / "agent/tokens.jsonl").read_text().splitlines()]
    assert len(lines) == len(sent) == len(upstream)
    as_sent = sorted(json.dumps(s, sort_keys=True) for s in sent)  # concurrent calls may finish in any order
    assert sorted(json.dumps({k: line[k] for k in TOKEN_FIELDS}, sort_keys=True) for line in lines) == as_sent
    assert all((line["source"], line["path"], line["why"]) == ("gateway", "/v1/messages", None) for line in lines)
    assert [line["call"] for line in lines] == list(range(len(lines)))
    atif = json.loads((folder / "agent/trajectory.json").read_text())
    in_atif = [c for step in atif["steps"] for c in (step.get("extra") or {}).get("model_calls", [])]
    assert sorted(json.dumps({k: c["metrics"][k] for k in TOKEN_FIELDS}, sort_keys=True) for c in in_atif) == as_sent
    log = (folder / "agent/logs" / cli.log).read_text()
    assert cli.log_mark in log and "token_ids" not in log and "logprobs" not in log  # a plain reply, as it knows
    network = (folder / "network.json").read_text()
    assert "token_ids" not in network  # the ids are in tokens.jsonl only


@pytest.mark.slow
def test_a_model_that_is_down_is_an_infrastructure_failure_not_the_agents(
    npm_registry: None, internet: TestInternet, model_api: StandInModel, agent_store: Path, tmp_path: Path
) -> None:
    run = cli_run(
        tmp_path, agent_store, internet, model_api,
        "agent.model_route.upstream=https://models.test:8444",  # nothing listens there
        "+agent.env.CLAUDE_CODE_MAX_RETRIES=1",  # Claude Code's own retries would take minutes
        "max_attempts=1",
    )  # fmt: skip
    result = run.result()
    assert result["outcome"] == "infra_error", result
    assert "model" in result["error"] and "unavailable" in result["error"]


def test_a_missing_key_stops_the_run_before_any_sandbox_starts(tmp_path: Path, runner_store: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "ANTHROPIC_API_KEY"}
    run = run_benchmark(tmp_path, runner_store, "agent=claude-code", env=env)
    assert run.done.returncode != 0
    assert "ANTHROPIC_API_KEY" in run.done.stderr and "not set" in run.done.stderr
    assert not (run.run_dir / "ledger.jsonl").exists() or not run.ledger()


# -- attacks on what is copied out ------------------------------------------------------------


def test_copying_the_logs_out_follows_no_link_and_keeps_to_its_caps(sandbox_for_logs: Sandbox) -> None:
    sandbox_for_logs.exec(
        f"mkdir -p {LOGS_DIR}/deep/er && echo run > {LOGS_DIR}/agent.log && echo nested > {LOGS_DIR}/deep/er/x.json"
        f" && ln -s /etc/passwd {LOGS_DIR}/passwd && ln -s /etc {LOGS_DIR}/etc && mkfifo {LOGS_DIR}/pipe"
        f" && truncate -s 64M {LOGS_DIR}/huge.bin && echo 'the task' > {INSTRUCTION_FILE}"
        f" && echo odd > '{LOGS_DIR}/name with spaces'"
    )
    files = collect_logs(sandbox_for_logs, max_bytes=1 << 20)
    assert files["agent.log"] == b"run\n" and files["deep/er/x.json"] == b"nested\n"
    assert files["name with spaces"] == b"odd\n"
    assert b"not copied" in files["huge.bin"] and len(files["huge.bin"]) < 200
    assert not {"passwd", "etc", "pipe", "instruction.md"} & set(files)
    assert not any(name.startswith("etc/") for name in files)


def test_an_agents_file_names_cannot_leave_the_episode_folder(tmp_path: Path) -> None:
    hostile = {"../../escape": b"a", "..": b"b", "./.": b"c", "a/../../b": b"d", "/abs/path": b"e", "ok.txt": b"f"}
    written = write_agent_files(tmp_path, "episodes/t/0-1", hostile)
    folder = (tmp_path / "episodes/t/0-1/agent/logs").resolve()
    for relative in written.values():
        assert (tmp_path / relative).resolve().is_relative_to(folder), relative
    assert sorted(p.name for p in tmp_path.iterdir()) == ["episodes"]
    assert (folder / "ok.txt").read_bytes() == b"f"
