"""Token capture: every model call of an episode keeps the token ids and log-probabilities the inference
server sent, in the ATIF trajectory and in ``agent/tokens.jsonl``, and the agent sees a plain reply.

The server is a stand-in that answers as vLLM does when asked (``tests/support/servers/inference.py``:
``logprobs``, ``return_token_ids``) with tokens drawn at random per reply, and keeps what it sent; so
what was recorded can only equal it by being what the server sent. Two ways in: ``agent=llm`` asking the
server itself (``chat_server``), and an agent inside the sandbox behind the model gateway, whose route
captures (``model_server`` on the test internet; Claude Code itself is in test_installed_agents.py).
"""

from __future__ import annotations

import json
import os
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from benchmarks.agents.chat import ChatEndpoint, complete
from envs.spaces.tokens import token_lines
from envs.spaces.trajectory import Trajectory
from pool import Backend, Sandbox, Snapshot
from pool.egress import NetworkPolicy, Phase
from pool.egress.models import tokens
from pool.egress.models.routes import ModelRoute
from pool.errors import ConfigError
from tests.support.backends import WORKSPACE_TEMPLATE, backend_params
from tests.support.fixtures.model_fixtures import StandInModel, model_egress
from tests.support.fixtures.net_fixtures import TestInternet, proxied_backend
from tests.support.fixtures.runner_fixtures import SOLVE, Run, run_benchmark
from tests.support.servers.chat_server import ChatServer, completion

pytest_plugins = [
    "tests.support.servers.chat_server",
    "tests.support.fixtures.runner_fixtures",
    "tests.support.fixtures.net_fixtures",
    "tests.support.fixtures.model_fixtures",
]

TOKEN_FIELDS = ("prompt_token_ids", "completion_token_ids", "logprobs")
SOLVE_REPLY = f"I count the 5xx lines.\n\n```bash\n{SOLVE}\n```\n"


def recorded(line: dict[str, Any]) -> dict[str, Any]:
    return {name: line[name] for name in TOKEN_FIELDS}


# -- agent=llm: the agent asks the server itself -------------------------------------------


def run_llm(server: ChatServer, tmp_path: Path, store: Path, *overrides: str) -> Run:
    env = {k: v for k, v in os.environ.items() if k != "OPENAI_API_KEY"}
    agent = ["agent=llm", f"agent.base_url={server.base_url}", "agent.model=scripted", "agent.api_key_env=''"]
    return run_benchmark(tmp_path, store, *agent, *overrides, env=env)


@pytest.mark.timeout(120)
def test_an_llm_episode_keeps_every_calls_tokens_exactly_as_the_server_sent_them(
    chat_server: ChatServer, tmp_path: Path, runner_store: Path
) -> None:
    chat_server.script([SOLVE_REPLY, "submit"])
    run = run_llm(chat_server, tmp_path, runner_store, "agent.capture_tokens=true")
    result = run.result()
    assert (result["outcome"], result["reward"]) == ("scored", 1.0), result
    asked = [r.body for r in chat_server.completions()]
    assert len(asked) == 2 and all(b["logprobs"] is True and b["return_token_ids"] is True for b in asked)
    folder = run.run_dir / result["files"]["dir"]
    lines = [json.loads(line) for line in (folder / "agent/tokens.jsonl").read_text().splitlines()]
    assert [recorded(line) for line in lines] == [sent.as_dict() for sent in chat_server.sent]
    assert [(line["call"], line["step"], line["source"], line["why"]) for line in lines] == [
        (0, 2, "agent", None), (1, 3, "agent", None)
    ]  # fmt: skip
    assert lines[0]["model"] == "scripted" and result["files"]["tokens"].endswith("agent/tokens.jsonl")
    atif = json.loads((folder / "agent/trajectory.json").read_text())
    metrics = [step["metrics"] for step in atif["steps"][1:]]
    assert [{name: m[name] for name in TOKEN_FIELDS} for m in metrics] == [s.as_dict() for s in chat_server.sent]
    assert token_lines(atif) == lines  # the file is the trajectory's view, nothing else


def test_without_capture_nothing_is_asked_and_no_token_file_is_written(
    chat_server: ChatServer, tmp_path: Path, runner_store: Path
) -> None:
    chat_server.script([SOLVE_REPLY, "submit"])
    run = run_llm(chat_server, tmp_path, runner_store)
    result = run.result()
    assert "tokens" not in result["files"] and not chat_server.sent
    assert all("logprobs" not in r.body and "return_token_ids" not in r.body for r in chat_server.completions())


def test_a_server_that_returns_no_tokens_gives_a_record_that_says_so(chat_server: ChatServer) -> None:
    chat_server.script([completion("plain"), "with tokens"])  # the first as a server that ignores the fields
    endpoint = ChatEndpoint(chat_server.base_url, "scripted", None, capture_tokens=True)
    plain = complete(endpoint, [{"role": "user", "content": "hi"}])
    assert plain.tokens is not None and plain.tokens["prompt_token_ids"] is None
    assert "no prompt token ids, completion token ids, log-probabilities" in plain.tokens["why"]
    captured = complete(endpoint, [{"role": "user", "content": "hi"}])
    assert captured.tokens is not None and captured.tokens["why"] is None
    assert recorded(captured.tokens) == chat_server.sent[-1].as_dict()
    assert captured.content == "with tokens"
    trajectory = Trajectory("task")
    trajectory.add("ls", {"output": ""}, {}, {"message": "", "tokens": plain.tokens})
    [line] = token_lines(trajectory.as_atif(session_id="s", agent="a", env_id="e"))
    assert line["completion_token_ids"] is None and "no prompt token ids" in line["why"]


# -- an agent inside the sandbox, behind the gateway ---------------------------------------

CALL = textwrap.dedent(
    """\
    import json, os, sys, urllib.request
    route, path, payload = sys.argv[1], sys.argv[2], sys.argv[3]
    base = os.environ["ANTHROPIC_BASE_URL"] if route == "anthropic" else os.environ["OPENAI_BASE_URL"][:-3]
    headers = {"content-type": "application/json", "x-api-key": "k", "authorization": "Bearer k"}
    request = urllib.request.Request(base + path, data=payload.encode(), headers=headers, method="POST")
    with urllib.request.urlopen(request, timeout=20) as reply:
        print(json.dumps({"status": reply.status, "type": reply.headers.get("content-type"),
                          "body": reply.read().decode()}))
    """
)
TOOL = {"name": "Bash", "input": {"command": "ls /app"}}


@pytest.fixture(scope="module", params=backend_params(["local"]))
def capture_backend(
    request: pytest.FixtureRequest,
    internet: TestInternet,
    model_api: StandInModel,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Backend]:
    egress = model_egress(internet, model_api, capture_tokens=True, upstream_api="openai")
    with proxied_backend(str(request.param), tmp_path_factory.mktemp("store"), egress) as backend:
        yield backend


@pytest.fixture()
def sandbox(capture_backend: Backend, model_api: StandInModel) -> Iterator[Sandbox]:
    snap: Snapshot = capture_backend.build(WORKSPACE_TEMPLATE)
    with capture_backend.create(snap) as sandbox:
        sandbox.write_file("/tmp/call.py", CALL.encode())
        sandbox.set_network(NetworkPolicy.offline(), phase=Phase.AGENT)
        yield sandbox


def call(sandbox: Sandbox, route: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    done = sandbox.exec(f"python3 /tmp/call.py {route} {path} '{json.dumps(body)}'", timeout_s=60)
    assert done.exit_code == 0, done.stderr
    reply: dict[str, Any] = json.loads(done.stdout)
    return reply


def test_the_gateway_asks_for_tokens_records_them_and_hands_the_agent_a_plain_completion(
    sandbox: Sandbox, model_api: StandInModel
) -> None:
    model_api.script({"text": "hello from the stand-in"})
    sent_before, asked_before = len(model_api.sent_tokens()), len(model_api.requests())
    messages = [{"role": "user", "content": "hi"}]
    plain = call(sandbox, "openai", "/v1/chat/completions", {"model": "m", "messages": messages})
    streamed = call(sandbox, "openai", "/v1/chat/completions", {"model": "m", "messages": messages, "stream": True})
    own = call(sandbox, "openai", "/v1/chat/completions", {"model": "m", "messages": messages, "logprobs": True})
    reply = json.loads(plain["body"])
    assert reply["choices"][0]["message"]["content"] == "hello from the stand-in"
    assert "prompt_token_ids" not in reply and "token_ids" not in reply["choices"][0]
    assert reply["choices"][0]["logprobs"] is None  # as a server answers who was not asked
    assert "token_ids" not in streamed["body"] and '"logprobs": null' in streamed["body"]
    text = "".join(
        json.loads(line[6:])["choices"][0]["delta"].get("content") or ""
        for line in streamed["body"].splitlines()
        if line.startswith("data: {") and json.loads(line[6:])["choices"]
    )
    assert text == "hello from the stand-in"
    assert json.loads(own["body"])["choices"][0]["logprobs"]["content"]  # the agent asked: it keeps them
    upstream = [r["body"] for r in model_api.requests()[asked_before:]]
    assert all(b["logprobs"] is True and b["return_token_ids"] is True for b in upstream)
    calls = sandbox.network_log().model_calls
    sent = model_api.sent_tokens()[sent_before:]
    assert len(calls) == len(sent) == 3
    assert [recorded(c.tokens or {}) for c in calls] == sent
    assert all(c.tokens and c.tokens["model"] == "stand-in" and c.tokens["why"] is None for c in calls)
    assert all(c.tokens and c.tokens["model_version"]["server"] == "uvicorn" for c in calls)


@pytest.mark.parametrize("stream", [False, True])
def test_claude_codes_messages_are_translated_for_an_inference_server_and_their_tokens_kept(
    sandbox: Sandbox, model_api: StandInModel, stream: bool
) -> None:
    model_api.script({"tool": TOOL}, {"text": "done"})
    sent_before, asked_before = len(model_api.sent_tokens()), len(model_api.requests())
    body: dict[str, Any] = {
        "model": "claude-stand-in", "max_tokens": 64, "stream": stream,
        "system": [{"type": "text", "text": "Be brief."}],
        "tools": [{"name": "Bash", "description": "run", "input_schema": {"type": "object"}}],
        "messages": [{"role": "user", "content": [{"type": "text", "text": "list /app"}]}],
    }  # fmt: skip
    first = call(sandbox, "anthropic", "/v1/messages", body)
    if stream:
        assert first["type"] == "text/event-stream"
        events = [json.loads(line[6:]) for line in first["body"].splitlines() if line.startswith("data: ")]
        assert [e["type"] for e in events][:2] == ["message_start", "content_block_start"]
        block = events[1]["content_block"]
        assert json.loads(events[2]["delta"]["partial_json"]) == TOOL["input"]
    else:
        message = json.loads(first["body"])
        assert (message["type"], message["stop_reason"]) == ("message", "tool_use")
        [block] = message["content"]
        assert block["input"] == TOOL["input"]
    assert (block["type"], block["name"]) == ("tool_use", "Bash")
    result = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": block["id"], "content": "x.txt"}]}
    used = {"role": "assistant", "content": [block | {"input": TOOL["input"]}]}
    second = call(sandbox, "anthropic", "/v1/messages", {**body, "messages": [*body["messages"], used, result]})
    assert "done" in second["body"]
    upstream = model_api.requests()[asked_before:]
    assert [r["path"] for r in upstream] == ["/v1/chat/completions"] * 2
    assert upstream[0]["body"]["messages"][0] == {"role": "system", "content": "Be brief."}
    assert upstream[0]["body"]["tools"][0]["function"]["name"] == "Bash" and upstream[0]["body"]["stream"] is False
    assert upstream[1]["body"]["messages"][-1] == {"role": "tool", "tool_call_id": block["id"], "content": "x.txt"}
    assert upstream[0]["headers"]["authorization"] == f"Bearer {model_api.api_key}"
    calls = sandbox.network_log().model_calls
    assert [recorded(c.tokens or {}) for c in calls] == model_api.sent_tokens()[sent_before:]
    assert [(c.path, c.input_tokens, c.output_tokens) for c in calls] == [("/v1/messages", 11, 7)] * 2


def test_a_call_whose_tokens_cannot_be_had_is_recorded_with_the_reason(
    sandbox: Sandbox, model_api: StandInModel
) -> None:
    model_api.script({"text": "hello"})
    call(sandbox, "openai", "/v1/responses", {"model": "m", "input": "hi"})
    [made] = sandbox.network_log().model_calls
    assert made.tokens is not None and made.tokens["completion_token_ids"] is None
    assert "captured from chat completions" in made.tokens["why"] and "/v1/responses" in made.tokens["why"]


def test_a_route_translating_anything_but_messages_to_chat_is_refused() -> None:
    with pytest.raises(ConfigError, match="upstream_api 'anthropic' is not supported for api 'openai'"):
        ModelRoute(name="o", api="openai", upstream="https://x.test", upstream_api="anthropic")


# -- the other servers' shapes ----------------------------------------------------------------


def test_sglangs_per_choice_ids_and_vllms_token_id_strings_are_read_as_the_ids() -> None:
    """SGLang (``python/sglang/srt/entrypoints/openai/protocol.py``) puts both id lists in the choice;
    vLLM with ``--return-tokens-as-token-ids`` and no ``return_token_ids`` writes each token as ``token_id:N``."""
    entries = [{"token": "token_id:7", "logprob": -0.5, "bytes": [], "top_logprobs": []},
               {"token": "token_id:9", "logprob": -1.25, "bytes": [], "top_logprobs": []}]  # fmt: skip
    sglang = {"model": "qwen", "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"},
              "logprobs": {"content": entries}, "prompt_token_ids": [1, 2], "token_ids": [7, 9]}]}  # fmt: skip
    captured = tokens.read_reply(sglang, server="sglang")
    assert (captured.prompt_token_ids, captured.completion_token_ids, captured.logprobs) == (
        [1, 2],
        [7, 9],
        [-0.5, -1.25],
    )
    vllm = {"model": "qwen", "prompt_token_ids": [1, 2], "choices": [{"index": 0, "logprobs": {"content": entries}}]}
    assert tokens.read_reply(vllm).completion_token_ids == [7, 9]
    stripped = tokens.strip(sglang, frozenset({tokens.HIDDEN_IDS, tokens.HIDDEN_LOGPROBS}))
    assert (
        stripped["choices"][0].keys() == {"index", "message", "logprobs"} and stripped["choices"][0]["logprobs"] is None
    )
    short = {**vllm, "choices": [{"index": 0, "token_ids": [7], "logprobs": {"content": entries}}]}
    assert "1 completion token ids but 2 log-probabilities" in (tokens.read_reply(short).why or "")
