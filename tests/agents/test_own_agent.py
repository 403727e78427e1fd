"""Your own agent (issue 32, item 1): ``agent=python agent.target=...`` plays a class from a user's file.

The agent is docs/agents.md's example, written into a folder outside the package
and played by the real entry point in a subprocess started there (a dotted
target, imported from the run's directory) or elsewhere (a file path target):
its reward, ledger, trajectory (its own messages and token counts) and the
viewer's data; a retry of an infrastructure failure it reports; a crash of the
runner after a checkpoint, resumed from its declared state. Each bad target
stops the run before any sandbox with exit 2 and one line. The Gymnasium-side
example, a chat model as a policy, runs against the local stand-in server.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from benchmarks.agents import make_agent
from benchmarks.agents.base import ResumableAgent
from benchmarks.viewer.reader import RunReader
from tests.runner.test_durable_episodes import kill_after, results
from tests.support.fixtures.runner_fixtures import REPO, SOLVE, TASK, run_benchmark
from tests.support.servers.chat_server import ChatServer

pytest_plugins = ["tests.support.servers.chat_server", "tests.support.fixtures.runner_fixtures"]

DOCS = (REPO / "docs" / "agents.md").read_text()
_PYTHON = re.compile(r"^```python\n(.*?)^```", re.M | re.S)
OTHER_TASK = "top-ips"
"""A second built-in task, which the example's commands do not solve."""


def documented(start: str) -> str:
    """The Python block of docs/agents.md that begins with ``start``."""
    (code,) = [block for block in _PYTHON.findall(DOCS) if block.startswith(start)]
    return str(code)


def write_agent(folder: Path) -> Path:
    """docs/agents.md's example agent as the user's file ``folder/my_agent.py``."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "my_agent.py"
    path.write_text(documented('"""my_agent.py'))
    return path


def runner(
    cwd: Path, store: Path, run_dir: Path, *overrides: str, timeout_s: float = 300
) -> subprocess.CompletedProcess[str]:
    """``python -m benchmarks.run`` started in ``cwd`` (a user's folder, not the repository)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    command = [
        sys.executable, "-m", "benchmarks.run", f"backend.store_dir={store}", f"output_dir={run_dir}",
        f"hydra.run.dir={run_dir.parent / (run_dir.name + '-hydra')}", "progress=false", "benchmark.plots=false",
        *overrides,
    ]  # fmt: skip
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout_s, check=False)


def commands(*actions: str) -> str:
    return f"+agent.kwargs.commands={json.dumps(list(actions))}"


def test_an_agent_in_a_users_file_plays_through_the_runner(tmp_path: Path, runner_store: Path) -> None:
    user = tmp_path / "project"
    write_agent(user)
    run_dir = tmp_path / "run"
    done = runner(user, runner_store, run_dir, "agent=python", "agent.target=my_agent:ScriptedAgent",
                  f"suite.include=[{TASK},{OTHER_TASK}]", commands("ls", SOLVE))  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["agent"] == "scripted"
    rewards = {r["task_id"]: (r["outcome"], r["reward"], r["agent"]) for r in results(run_dir)}
    assert rewards == {TASK: ("scored", 1.0, "scripted"), OTHER_TASK: ("scored", 0.0, "scripted")}

    (result,) = [r for r in results(run_dir) if r["task_id"] == TASK]
    trajectory = json.loads((run_dir / result["files"]["trajectory"]).read_text())
    assert trajectory["agent"]["name"] == "scripted"
    turns = [step for step in trajectory["steps"] if step["source"] == "agent"]
    assert [step["message"] for step in turns] == ["running ls", f"running {SOLVE}", "running submit"]
    assert {step["model_name"] for step in turns} == {"scripted"}
    assert turns[1]["metrics"] == {"prompt_tokens": len("access.log\n[exit code 0]"), "completion_tokens": len(SOLVE)}

    reader = RunReader(run_dir)
    assert reader.run()["state"] == "finished"
    page = reader.episode(result["episode_id"])
    assert page is not None and page["result"]["reward"] == 1.0
    steps = page["trajectory"]["steps"]
    assert [step["message"] for step in steps] == [step["message"] for step in turns]
    assert steps[1]["tokens"] == turns[1]["metrics"] and steps[1]["model_name"] == "scripted"
    assert page["tokens"] == sum(v for step in turns for v in step["metrics"].values())


FLAKY = '''
from benchmarks.agents import ModelUnavailableError
from my_agent import ScriptedAgent


class FlakyAgent(ScriptedAgent):
    """The example agent, whose model is down for its first episode."""

    failed = False

    def start(self, episode):
        if not FlakyAgent.failed:
            FlakyAgent.failed = True
            raise ModelUnavailableError("the model endpoint is down")
        return super().start(episode)
'''


def test_an_infrastructure_failure_the_agent_reports_is_retried(tmp_path: Path, runner_store: Path) -> None:
    user = tmp_path / "project"
    write_agent(user)
    (user / "flaky.py").write_text(FLAKY)
    run_dir = tmp_path / "run"
    # a file target: its folder goes on sys.path, so it imports its neighbour my_agent.py
    done = runner(tmp_path, runner_store, run_dir, "agent=python", "agent.target=project/flaky.py:FlakyAgent",
                  f"suite.include=[{TASK}]", commands(SOLVE))  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    records = [json.loads(line) for line in (run_dir / "ledger.jsonl").read_text().splitlines()]
    (failed,) = [r for r in records if r["kind"] == "attempt_failed"]
    assert (failed["attempt"], failed["error"]) == (1, "ModelUnavailableError: the model endpoint is down")
    (result,) = results(run_dir)
    assert (result["attempt"], result["infra_failures"], result["outcome"], result["reward"], result["agent"]) == (
        2, 1, "scored", 1.0, "scripted",
    )  # fmt: skip


def test_a_killed_run_goes_on_from_the_agents_declared_state(tmp_path: Path, runner_store: Path) -> None:
    """The example declares its state (the next command): killed after the checkpoint at step 2, the resumed
    run rebuilds its policy there and plays steps 3 to 5 only."""
    agent = write_agent(tmp_path / "project")
    steps = [f"echo {n} >> /app/steps.txt" for n in (1, 2)] + ["sleep 3; echo 3 >> /app/steps.txt",
                                                             "echo 4 >> /app/steps.txt", SOLVE]  # fmt: skip
    run_dir = tmp_path / "run"
    overrides = ["agent=python", f"agent.target={agent}:ScriptedAgent", commands(*steps), "checkpoint_every=2"]
    kill_after(tmp_path, runner_store, run_dir, overrides, "checkpoint", 2)  # killed in step 3
    journal = [json.loads(line) for line in (run_dir / "episodes" / TASK / "0-journal.jsonl").read_text().splitlines()]
    assert [r["agent_state"] for r in journal if r.get("type") == "checkpoint"] == [{"next": 2}]
    run_benchmark(tmp_path, runner_store, "resume=true", name="run").summary()
    (result,) = results(run_dir)
    assert (result["outcome"], result["reward"], result["resumed_from_step"], result["steps_replayed"]) == (
        "scored", 1.0, 2, 0,
    )  # fmt: skip
    trajectory = json.loads((run_dir / result["files"]["trajectory"]).read_text())
    messages = [step["message"] for step in trajectory["steps"] if step["source"] == "agent"]
    assert messages == [f"running {action}" for action in [*steps, "submit"]]


BAD_AGENTS = """
from benchmarks.agents import EpisodeContext


class NoStart:
    def begin(self, episode: EpisodeContext) -> None: ...


class Picky:
    def __init__(self, *, steps: int) -> None: ...

    def start(self, episode: EpisodeContext) -> None: ...


class Broken:
    def __init__(self) -> None:
        raise RuntimeError("no model configured")

    def start(self, episode: EpisodeContext) -> None: ...


def a_function() -> None: ...
"""


@pytest.mark.parametrize(
    ("target", "extra", "says"),
    [
        ("my_agent.ScriptedAgent", [], "agent.target must be module:Class or path/to/file.py:Class"),
        ("no_such_module:Agent", [], "no module named 'no_such_module' importable from"),
        ("missing/agent.py:Agent", [], "agent.target: no file"),
        ("syntax_error:Agent", [], "importing syntax_error failed: SyntaxError"),
        (
            "imports_missing:Agent",
            [],
            "imports_missing failed: ModuleNotFoundError: No module named 'torchh'",
        ),
        ("my_agent:ScriptedAgnt", [], "my_agent has no 'ScriptedAgnt'; did you mean ScriptedAgent"),
        ("bad_agents:a_function", [], "a_function is a function, not a class"),
        ("bad_agents:NoStart", [], "class NoStart has no start() method"),
        ("bad_agents:Picky", ["+agent.kwargs.step=3"], "agent.kwargs {'step': 3} do not fit Picky(*, steps: int)"),
        ("bad_agents:Broken", [], "Broken(**agent.kwargs) failed: RuntimeError: no model configured"),
    ],
    ids=[
        "no-colon",
        "no-module",
        "no-file",
        "syntax",
        "its-import",
        "no-class",
        "not-a-class",
        "no-start",
        "kwargs",
        "constructor",
    ],
)
def test_a_bad_target_stops_the_run_with_one_line_before_any_sandbox(
    tmp_path: Path, target: str, extra: list[str], says: str
) -> None:
    write_agent(tmp_path)
    (tmp_path / "bad_agents.py").write_text(BAD_AGENTS)
    (tmp_path / "syntax_error.py").write_text("class Agent(:\n")
    (tmp_path / "imports_missing.py").write_text("import torchh\n")
    store = tmp_path / "store"
    done = runner(tmp_path, store, tmp_path / "run", "agent=python", f"agent.target={target}", *extra, timeout_s=120)
    assert done.returncode == 2, done.stderr[-3000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("snapgym: ConfigError: "), done.stderr
    assert says in lines[0]
    assert not store.exists() and not (tmp_path / "run" / "ledger.jsonl").exists()  # no task built, nothing played


def test_a_chat_model_becomes_a_gymnasium_policy(chat_server: ChatServer, tmp_path: Path) -> None:
    """docs/agents.md's policy, against the stand-in: each of the two episodes has its own conversation, the
    model's fenced command is the action, ``submit`` ends the episode, the key goes in the header."""
    code = documented("import json")
    head = code.split("\npolicy = chat_policy(", 1)[0]
    assert len(head.strip().splitlines()) < 30
    chat_server.script(lambda request: f"```bash\n{SOLVE}\n```" if len(request.messages) == 2 else "submit")
    env = {**os.environ, "OPENAI_BASE_URL": chat_server.base_url, "OPENAI_API_KEY": "k-123", "OPENAI_MODEL": "m"}
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == f"{TASK} [1. 1.]"
    requests = chat_server.completions()
    assert len(requests) == 4
    assert all(r.headers["authorization"] == "Bearer k-123" and r.body["model"] == "m" for r in requests)
    firsts: list[Any] = [r.messages for r in requests if len(r.messages) == 2]
    assert len(firsts) == 2 and all("5xx" in m[1]["content"] for m in firsts)  # the instruction, per episode


STATELESS = """
class Agent:
    def start(self, episode):
        return Policy()

    def resume(self, episode, state):
        return Policy()


class Policy:
    last_turn = {"message": "hi"}

    def act(self, observation, info):
        return "submit"
"""


def test_an_agent_with_resume_but_a_policy_without_state_gets_checkpoints_that_say_what_is_missing(
    tmp_path: Path,
) -> None:
    (tmp_path / "stateless.py").write_text(STATELESS)
    agent = make_agent({"name": "python", "target": f"{tmp_path / 'stateless.py'}:Agent", "kwargs": {}})
    assert isinstance(agent, ResumableAgent) and (agent.name, agent.whole_task_steps) == ("Agent", False)
    policy = agent.start(None)  # type: ignore[arg-type]
    assert policy.act({"output": ""}, {}) == "submit" and policy.last_turn == {"message": "hi"}
    with pytest.raises(TypeError, match=r"Policy has no state\(\) method"):
        policy.state()


def test_an_agent_without_resume_is_not_durable(tmp_path: Path) -> None:
    (tmp_path / "plain.py").write_text(STATELESS.replace("def resume", "def not_resume"))
    agent = make_agent({"name": "python", "target": f"{tmp_path / 'plain.py'}:Agent", "kwargs": {}})
    assert not isinstance(agent, ResumableAgent)
