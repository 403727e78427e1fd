"""Real coding agents (Claude Code, from npm) installed into a task's snapshot and run inside the sandbox
by the real runner, talking to a stand-in model through the model gateway, with their key outside.

The CLI comes from its registry (npm); a machine that cannot reach the registry skips these tests
and says so. The model is ``model_fixtures``' stand-in on the test internet, scripted to solve the
built-in task: it answers Claude Code's first call with a Bash tool call that solves it, and the
next with "done". What is checked is what a user relies on: the reward comes from the verifier
(1.0), the key never reaches the sandbox or the run's files, every call and its tokens are on
record, the agent's own log is in the episode's folder, and a model that is down is an
infrastructure failure, not the agent's.
"""

from __future__ import annotations

import ipaddress
import json
import os
import socket
import subprocess
from pathlib import Path

import pytest
from model_fixtures import KEY_VARIABLE, NAME, StandInModel
from net_fixtures import TestInternet
from runner_fixtures import SOLVE, Run, run_benchmark

pytest_plugins = ["net_fixtures", "model_fixtures", "runner_fixtures"]

CLAUDE_CODE = "@anthropic-ai/claude-code@2.1.332"
"""The version configs/agent/claude-code.yaml pins."""
INSTALL_TIMEOUT_S = 900


@pytest.fixture(scope="module")
def npm_registry() -> None:
    """Skip unless npm can reach its registry from here (the CLI is installed from it, as its vendor says)."""
    try:
        done = subprocess.run(["npm", "view", CLAUDE_CODE, "version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        pytest.skip(f"npm cannot reach its registry here ({exc}); Claude Code cannot be installed")
    if done.returncode != 0:
        pytest.skip(f"npm cannot reach its registry here: {done.stderr.strip()[-300:]}")


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


def claude_code_run(
    tmp_path: Path, store: Path, internet: TestInternet, model: StandInModel, *overrides: str, name: str = "run"
) -> Run:
    """The runner playing the task with agent=claude-code, its model route pointed at the stand-in."""
    hosts = [f"{host}={address}" for host, address in {**internet.hosts, NAME: model.address}.items()]
    return run_benchmark(
        tmp_path,
        store,
        "agent=claude-code",
        "agent.model=claude-stand-in",
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


def test_claude_code_installed_in_the_snapshot_solves_the_task_with_its_key_outside(
    npm_registry: None, internet: TestInternet, model_api: StandInModel, agent_store: Path, tmp_path: Path
) -> None:
    model_api.script({"tool": {"name": "Bash", "input": {"command": SOLVE, "description": "count 5xx"}}},
                     {"text": "The answer is in /app/answer.txt."})  # fmt: skip
    before = len(model_api.requests())
    run = claude_code_run(tmp_path, agent_store, internet, model_api)
    summary = run.summary()
    result = run.result()
    assert (result["outcome"], result["reward"]) == ("scored", 1.0), result
    assert result["agent"] == "claude-code@2.1.332:claude-stand-in"  # the pinned version, in every result
    calls = model_api.requests()[before:]
    assert len(calls) >= 2 and all(c["headers"].get("x-api-key") == model_api.api_key for c in calls)
    assert calls[0]["body"]["model"] == "claude-stand-in"
    model = result["network"]["model"]
    assert model["calls"] == len(calls) and model["input_tokens"] == 11 * len(calls)
    assert model["routes"]["anthropic"]["output_tokens"] == 7 * len(calls)
    folder = run.run_dir / result["files"]["dir"]
    log = (folder / "agent/logs/claude-code.jsonl").read_text()
    assert '"tool_use"' in log and "answer.txt" in log  # the agent's own trajectory, copied out
    network = json.loads((folder / "network.json").read_text())
    assert [c["path"] for c in network["model_calls"]] == ["/v1/messages"] * len(calls)
    assert model_api.api_key not in every_file_text(run.run_dir)  # nor in the ledger, the files, the config
    assert summary["counts"]["scored"] == 1


def test_a_model_that_is_down_is_an_infrastructure_failure_not_the_agents(
    npm_registry: None, internet: TestInternet, model_api: StandInModel, agent_store: Path, tmp_path: Path
) -> None:
    run = claude_code_run(tmp_path, agent_store, internet, model_api, "agent.model_route.upstream=https://models.test:8444",
                          "max_attempts=1")  # fmt: skip
    result = run.result()
    assert result["outcome"] == "infra_error", result
    assert "model" in result["error"] and "unavailable" in result["error"]


def test_a_missing_key_stops_the_run_before_any_sandbox_starts(tmp_path: Path, runner_store: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "ANTHROPIC_API_KEY"}
    run = run_benchmark(tmp_path, runner_store, "agent=claude-code", env=env)
    assert run.done.returncode != 0
    assert "ANTHROPIC_API_KEY" in run.done.stderr and "not set" in run.done.stderr
    assert not (run.run_dir / "ledger.jsonl").exists() or not run.ledger()
