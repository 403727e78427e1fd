"""The llm agent: its reply parsing, its chat client, and whole runs against a local stand-in model server.

The runs go through the real entry point (``python -m benchmarks.run agent=llm ...``) on the built-in
task log-error-count, with the model played by ``chat_server.ChatServer``: a real HTTP server that speaks
the chat completions protocol and records every request.
"""

from __future__ import annotations

import json
import os
import re
import uuid
from pathlib import Path
from typing import Any

import pytest

from benchmarks.agents import LLMAgent, ModelRequestError, ModelUnavailableError
from benchmarks.agents.chat import ChatEndpoint, complete
from benchmarks.agents.llm import action_from_reply, clip
from benchmarks.episodes.recording.ledger import ATTEMPT, ATTEMPT_FAILED, RESULT
from envs.spaces.actions import SUBMIT
from envs.tasks import load_task
from pool.errors import ConfigError
from tests.support.fixtures.runner_fixtures import EPISODE, SOLVE, TASK, Run, run_benchmark
from tests.support.servers.chat_server import ChatServer, RawResponse, completion

pytest_plugins = ["tests.support.servers.chat_server", "tests.support.fixtures.runner_fixtures"]

KEY_ENV = "SNAPGYM_TEST_KEY"
SOLVE_REPLY = f"The status is field 9; I count the 5xx lines.\n\n```bash\n{SOLVE}\ncat /app/answer.txt\n```\n"


def new_secret() -> str:
    return f"sk-snapgym-{uuid.uuid4().hex}"


def run_llm(server: ChatServer, tmp_path: Path, store: Path, *overrides: str, secret: str | None = "sk-unused") -> Run:
    """``python -m benchmarks.run agent=llm`` against ``server``, with ``secret`` in $SNAPGYM_TEST_KEY."""
    env = {k: v for k, v in os.environ.items() if k != KEY_ENV}
    if secret is not None:
        env[KEY_ENV] = secret
    agent = ["agent=llm", f"agent.base_url={server.base_url}", "agent.model=scripted", f"agent.api_key_env={KEY_ENV}"]
    return run_benchmark(tmp_path, store, *agent, *overrides, env=env)


def fenced(command: str) -> str:
    return f"Next:\n```bash\n{command}\n```"


# -- turning a reply into an action ------------------------------------------------


@pytest.mark.parametrize(
    ("reply", "action"),
    [
        ("I will list the files.\n```bash\nls -la /app\n```\nThen I look.", "ls -la /app"),
        ("```\ncd /app\nwc -l access.log\n```", "cd /app\nwc -l access.log"),
        ("First\n```bash\nls\n```\nno, rather\n```sh\npwd\n```\n", "pwd"),
        ("submit", SUBMIT),
        ("  Submit\n", SUBMIT),
        ("```submit```", SUBMIT),
        ("Done.\n```\nsubmit\n```", SUBMIT),
        ("ls /app", "ls /app"),
        ("  echo hi  \n", "echo hi"),
        ("```python\nprint('a')\n\n```", "print('a')"),
    ],
)
def test_action_from_reply(reply: str, action: str) -> None:
    """The action is ``submit``, else the last fenced block, else the whole (stripped) reply."""
    assert action_from_reply(reply) == action


def test_a_block_that_mentions_submit_is_not_a_submission() -> None:
    """Only a reply or block that is exactly ``submit`` ends the episode."""
    assert action_from_reply("```bash\necho submit > /app/answer.txt\n```") == "echo submit > /app/answer.txt"


def test_clip_keeps_short_text() -> None:
    assert clip("abc", 3) == "abc"
    assert clip("", 0) == ""


@pytest.mark.parametrize("limit", [10, 11, 1, 0])
def test_clip_keeps_head_and_tail_and_says_how_much_it_cut(limit: int) -> None:
    """A long text keeps ``limit`` characters, its head and its tail, and the marker counts the rest."""
    text = "".join(chr(ord("a") + i % 26) for i in range(40))
    clipped = clip(text, limit)
    head, marker, tail = clipped.split("\n")
    assert marker == f"[... {len(text) - limit} characters cut ...]"
    assert len(head) + len(tail) == limit
    assert text.startswith(head)
    assert text.endswith(tail)


# -- the chat client against the stand-in server --------------------------------------


def endpoint(server: ChatServer, *, key: str | None = "sk-client", max_retries: int = 2) -> ChatEndpoint:
    return ChatEndpoint(server.base_url, "scripted", key, timeout_s=10, max_retries=max_retries, backoff_s=0.0)


def test_client_sends_model_messages_params_and_bearer_key(chat_server: ChatServer) -> None:
    chat_server.script(["hello"])
    reply = complete(endpoint(chat_server), [{"role": "user", "content": "hi"}], temperature=0.5)
    assert (reply.content, reply.prompt_tokens, reply.completion_tokens) == ("hello", 10, 5)
    (request,) = chat_server.completions()
    assert request.headers["authorization"] == "Bearer sk-client"
    assert request.headers["content-type"] == "application/json"
    assert request.body == {"model": "scripted", "messages": [{"role": "user", "content": "hi"}], "temperature": 0.5}


def test_client_without_key_sends_no_authorization(chat_server: ChatServer) -> None:
    complete(endpoint(chat_server, key=None), [{"role": "user", "content": "hi"}])
    assert "authorization" not in chat_server.completions()[0].headers


@pytest.mark.parametrize("status", [408, 429, 500, 502, 503, 504])
def test_client_retries_transient_statuses(chat_server: ChatServer, status: int) -> None:
    chat_server.script(["ok"])
    chat_server.fail_next(status, times=2)
    assert complete(endpoint(chat_server, max_retries=2), [{"role": "user", "content": "hi"}]).content == "ok"
    assert len(chat_server.completions()) == 3


def test_client_gives_up_after_max_retries(chat_server: ChatServer) -> None:
    chat_server.fail_next(503, times=None)
    with pytest.raises(ModelUnavailableError, match="HTTP 503"):
        complete(endpoint(chat_server, max_retries=2), [{"role": "user", "content": "hi"}])
    assert len(chat_server.completions()) == 3


@pytest.mark.parametrize("status", [400, 401, 403, 404])
def test_client_does_not_retry_a_refused_request(chat_server: ChatServer, status: int) -> None:
    chat_server.fail_next(status, times=None)
    with pytest.raises(ModelRequestError, match=f"HTTP {status}"):
        complete(endpoint(chat_server), [{"role": "user", "content": "hi"}])
    assert len(chat_server.completions()) == 1


def test_client_unreachable_server_is_unavailable() -> None:
    server = ChatServer()
    server.start()
    gone = endpoint(server, max_retries=1)
    server.close()
    with pytest.raises(ModelUnavailableError, match="cannot reach"):
        complete(gone, [{"role": "user", "content": "hi"}])


@pytest.mark.parametrize(
    "reply",
    [
        {"id": "x", "object": "chat.completion"},
        {"choices": []},
        {"choices": [{"index": 0, "finish_reason": "stop"}]},
        {"error": {"message": "upstream model crashed", "type": "server_error", "code": 500}},
        ["not", "an", "object"],
    ],
)
def test_client_200_reply_that_is_not_a_completion_is_an_endpoint_failure(chat_server: ChatServer, reply: Any) -> None:
    """An HTTP 200 with an error body or without choices[0].message is the endpoint failing: retried, then
    ModelUnavailableError (an infrastructure failure), never the agent's error."""
    chat_server.script(lambda request: RawResponse(json.dumps(reply).encode()))
    with pytest.raises(ModelUnavailableError, match=r"error|choices"):
        complete(endpoint(chat_server, max_retries=2), [{"role": "user", "content": "hi"}])
    assert len(chat_server.completions()) == 3


def test_client_null_content_is_an_empty_reply(chat_server: ChatServer) -> None:
    chat_server.script([completion(None)])
    assert complete(endpoint(chat_server), [{"role": "user", "content": "hi"}]).content == ""


@pytest.mark.parametrize("usage", [None, {}, {"prompt_tokens": None, "completion_tokens": None}])
def test_client_missing_usage_counts_no_tokens(chat_server: ChatServer, usage: dict[str, Any] | None) -> None:
    """Servers that do not count tokens (no usage, or nulls in it) still give a usable reply."""
    chat_server.script([{**completion("ls"), "usage": usage}])
    reply = complete(endpoint(chat_server), [{"role": "user", "content": "hi"}])
    assert (reply.content, reply.prompt_tokens, reply.completion_tokens) == ("ls", 0, 0)


@pytest.mark.parametrize(
    "response",
    [
        RawResponse(b"<html>bad gateway</html>", 200, {"Content-Type": "text/html"}),
        RawResponse(b'{"choices": [', 200, {"Content-Type": "application/json", "Content-Length": "4000"}),
    ],
    ids=["not-json", "truncated"],
)
def test_client_broken_transport_is_retried_then_unavailable(chat_server: ChatServer, response: RawResponse) -> None:
    """A body that is not JSON, or cut short by a dropped connection, is a transient failure."""
    chat_server.script(lambda request: response)
    with pytest.raises(ModelUnavailableError):
        complete(endpoint(chat_server, max_retries=1), [{"role": "user", "content": "hi"}])
    assert len(chat_server.completions()) == 2


def test_agent_refuses_to_start_without_its_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(KEY_ENV, raising=False)
    with pytest.raises(ConfigError, match=KEY_ENV):
        LLMAgent(base_url="http://127.0.0.1:9/v1", model="m", api_key_env=KEY_ENV)
    LLMAgent(base_url="http://127.0.0.1:9/v1", model="m", api_key_env="")  # a server without auth needs none


# -- whole runs through the runner ---------------------------------------------------


@pytest.mark.timeout(120)
def test_scripted_model_solves_the_task(chat_server: ChatServer, tmp_path: Path, runner_store: Path) -> None:
    """The runner asks the model, runs its fenced command, sends back the output, and the verifier scores 1."""
    secret = new_secret()
    chat_server.script([SOLVE_REPLY, "submit"])
    run = run_llm(chat_server, tmp_path, runner_store, secret=secret)
    summary = run.summary()
    assert summary["mean_reward"] == 1.0
    assert summary["counts"]["scored"] == 1
    result = run.result()
    assert (result["outcome"], result["reward"], result["end_reason"]) == ("scored", 1.0, "submitted")
    assert result["agent"] == "llm:scripted"

    first, second = chat_server.completions()
    for request in (first, second):
        assert request.headers["authorization"] == f"Bearer {secret}"
        assert request.body["model"] == "scripted"
        assert request.body["seed"] == 0
    system, instruction = first.messages
    assert system["role"] == "system"
    assert "submit" in system["content"]
    assert instruction == {"role": "user", "content": load_task(TASK).instruction}
    # the conversation grows by the model's reply and the observation of its action
    assert second.messages[:2] == first.messages
    assert second.messages[2] == {"role": "assistant", "content": SOLVE_REPLY}
    assert second.messages[3]["role"] == "user"
    assert "127" in second.messages[3]["content"]

    # the episode's folder: the trajectory in ATIF, with the model's replies and token counts
    trajectory = json.loads((run.run_dir / result["files"]["trajectory"]).read_text())
    assert trajectory["schema_version"] == "ATIF-v1.4" and trajectory["agent"]["model_name"] == "scripted"
    user, solve, submit = trajectory["steps"]
    assert user == {"step_id": 1, "source": "user", "message": load_task(TASK).instruction}
    assert solve["message"] == SOLVE_REPLY and solve["model_name"] == "scripted"
    assert solve["metrics"] == {"prompt_tokens": 10, "completion_tokens": 5}
    assert "127" in solve["observation"]["results"][0]["content"] and solve["extra"]["exit_code"] == 0
    assert submit["tool_calls"][0]["function_name"] == "submit"
    assert trajectory["final_metrics"] == {"total_steps": 2, "total_prompt_tokens": 20, "total_completion_tokens": 10}
    assert json.loads((run.run_dir / result["files"]["result"]).read_text()) == result


@pytest.mark.timeout(120)
def test_the_key_never_reaches_the_sandbox_or_the_records(
    chat_server: ChatServer, tmp_path: Path, runner_store: Path
) -> None:
    """Actions that dump the sandbox's environments and search its files never see the key.

    The search builds the key from two halves inside the sandbox, so no request the runner sends carries it
    (in an action or an observation) unless the sandbox had it; only the Authorization header may.
    """
    secret = new_secret()
    half = len(secret) // 2
    probes = [
        "env",
        r"cat /proc/1/environ | tr '\0' '\n'",
        r"for f in /proc/[0-9]*/environ; do tr '\0' '\n' < $f; echo; done",
        # every file of the sandbox's own filesystem (-xdev: not the read-only host /usr, /proc or /dev)
        f"key=$(printf %s%s {secret[:half]} {secret[half:]}); files=$(find / -xdev -type f | wc -l); "
        'hits=$(find / -xdev -type f -exec grep -lF "$key" {} + 2>/dev/null | wc -l); '
        'echo "searched $files files, $hits hold the key"',
    ]
    chat_server.script([*map(fenced, probes), "submit"])
    run = run_llm(chat_server, tmp_path, runner_store, "step_timeout_s=60", secret=secret)
    assert run.result()["outcome"] == "scored", run.result()

    requests = chat_server.completions()
    assert len(requests) == len(probes) + 1
    observations = [m["content"] for m in requests[-1].messages[2:] if m["role"] == "user"]
    assert len(observations) == len(probes)
    assert "PATH=" in observations[0]  # the probes ran: env, and the environ of the processes it may read
    assert "PATH=" in observations[2]
    assert re.search(r"searched [1-9]\d* files, 0 hold the key", observations[-1]), observations[-1]
    for request in requests:
        assert secret not in request.raw_body.decode()
        assert request.headers["authorization"] == f"Bearer {secret}"

    assert secret not in run.done.stdout + run.done.stderr
    written = [p for d in (run.run_dir, run.hydra_dir) for p in d.rglob("*") if p.is_file()]
    assert {"ledger.jsonl", "run.yaml", "episodes.csv", "summary.json"} <= {p.name for p in written}
    for path in written:
        assert secret.encode() not in path.read_bytes(), path
    assert KEY_ENV in (run.run_dir / "run.yaml").read_text()  # the variable's name is kept, not its value


@pytest.mark.timeout(120)
def test_transient_503_is_retried_inside_the_client(
    chat_server: ChatServer, tmp_path: Path, runner_store: Path
) -> None:
    chat_server.script([SOLVE_REPLY, "submit"])
    chat_server.fail_next(503, times=2)
    run = run_llm(chat_server, tmp_path, runner_store)
    assert run.summary()["mean_reward"] == 1.0
    assert len(chat_server.completions()) == 4
    assert [r["kind"] for r in run.ledger()] == [ATTEMPT, RESULT]


@pytest.mark.timeout(120)
def test_model_down_is_an_outage_that_stops_the_run_without_burning_attempts(
    chat_server: ChatServer, tmp_path: Path, runner_store: Path
) -> None:
    """Every request fails from the start: the failed attempt is an outage casualty (not counted), the probes
    back off, and as the endpoint never answered the run stops (exit 3, summary.json written, the reason and
    what to check on one line); see test_runner_outage."""
    chat_server.fail_next(503, times=None)
    run = run_llm(chat_server, tmp_path, runner_store, "agent.max_retries=0", "max_attempts=2", "outage_timeout_s=1")
    assert run.done.returncode == 3, run.done.stderr[-3000:]
    assert run.done.stderr.splitlines()[-1].startswith(
        "snapgym: run stopped: UnreachableError: the model endpoint never answered since the run started"
    )
    assert "is the model server running" in run.done.stderr.splitlines()[-1]
    assert "HTTP 503" in run.done.stderr.splitlines()[-1]
    summary = json.loads((run.run_dir / "summary.json").read_text())
    assert summary["counts"]["finished"] == summary["counts"]["infra_error"] == 0
    assert summary["counts"]["retried_attempts"] == 0
    assert summary["counts"]["outage_attempts"] == 1
    assert summary["stopped"].startswith("UnreachableError")

    records = run.ledger()
    assert [(r["kind"], r["attempt_id"]) for r in records] == [
        (ATTEMPT, f"{EPISODE}/1"),
        (ATTEMPT_FAILED, f"{EPISODE}/1"),
    ]
    assert records[1]["outage"] is True and "HTTP 503" in records[1]["error"]
    assert 2 <= len(chat_server.completions()) <= 6  # the attempt's request, then a few backed-off probes


@pytest.mark.timeout(120)
def test_a_refused_key_stops_the_run_and_a_resume_plays_the_episode(
    chat_server: ChatServer, tmp_path: Path, runner_store: Path
) -> None:
    """401 stops the run (exit 2, the status named) with no result for the episode; a resume plays it."""
    chat_server.fail_next(401, times=None)
    stopped = run_llm(chat_server, tmp_path, runner_store)
    assert stopped.done.returncode == 2
    assert "HTTP 401" in stopped.done.stderr
    assert [r["kind"] for r in stopped.ledger()] == [ATTEMPT]
    assert not (stopped.run_dir / "summary.json").exists()
    assert len(chat_server.completions()) == 1

    chat_server.script([SOLVE_REPLY, "submit"])
    chat_server.stop_failing()
    resumed = run_llm(chat_server, tmp_path, runner_store, "resume=true")
    assert resumed.summary()["mean_reward"] == 1.0
    records = resumed.ledger()
    assert [(r["kind"], r["attempt"]) for r in records] == [
        (ATTEMPT, 1),
        (ATTEMPT_FAILED, 1),
        (ATTEMPT, 2),
        (RESULT, 2),
    ]
    assert records[1]["interrupted"] is True
    assert records[-1]["infra_failures"] == 0


@pytest.mark.timeout(120)
def test_missing_key_fails_before_any_sandbox(chat_server: ChatServer, tmp_path: Path) -> None:
    store = tmp_path / "store"
    run = run_llm(chat_server, tmp_path, store, secret=None)
    assert run.done.returncode == 2
    assert f"${KEY_ENV}" in run.done.stderr
    assert "ConfigError" in run.done.stderr
    assert not store.exists()
    assert chat_server.requests == []


@pytest.mark.timeout(120)
def test_a_200_reply_with_an_error_body_is_retried_as_an_endpoint_failure(
    chat_server: ChatServer, tmp_path: Path, runner_store: Path
) -> None:
    """The first reply is an HTTP 200 with an error body: the client retries it (not an agent error)."""
    chat_server.script([{"error": {"message": "overloaded", "type": "server_error"}}, SOLVE_REPLY, "submit"])
    run = run_llm(chat_server, tmp_path, runner_store)
    summary = run.summary()
    assert summary["counts"]["agent_error"] == 0
    assert summary["mean_reward"] == 1.0
    assert [r["kind"] for r in run.ledger()] == [ATTEMPT, RESULT]
    assert len(chat_server.completions()) == 3
