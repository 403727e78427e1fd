"""Durable episodes (issue 16, part 3): a runner killed mid-episode goes on from the last checkpoint.

The proof runs the real entry point in subprocesses: a 50-step scripted episode
(the replay agent, checkpoint_every=10) is killed with SIGKILL right after its
checkpoint at step 30 and again after the one at step 40; each resume goes on
from there, and the end state's digest, the reward and the trajectory equal those
of an uninterrupted run of the same script. What cannot go on falls back to a
replay from the start and says how many steps it played again: a Python-v0
episode (its interpreter's variables are in a process), and a checkpoint whose
journalled digest does not match what the store restores.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest

import envs  # noqa: F401 (registers the environments)
from benchmarks.agents.base import EpisodeContext
from benchmarks.agents.replay import ReplayAgent
from benchmarks.episodes.recording.journal import Checkpoint, EpisodeJournal
from envs.tasks import load_task
from pool import LocalBackend
from pool.changes import Changes
from pool.errors import ConfigError
from pool.labels import RUN
from tests.envs.test_envs_infra import kill_init_from_the_host
from tests.runner.test_runner_ledger import evaluate
from tests.support.backends import need_backend
from tests.support.fixtures.runner_fixtures import REPO, TASK, run_benchmark
from tests.support.servers.chat_server import ChatRequest, ChatServer

pytest_plugins = ["tests.support.servers.chat_server", "tests.support.fixtures.runner_fixtures"]

SOLVE = "awk '$9 ~ /^5/' /app/access.log | wc -l > /app/answer.txt"
PAUSE_S = 3
"""How long the steps right after the kills' checkpoints take, so that the kill lands in them."""


def shell_script() -> list[str]:
    """50 steps that build a file from a working directory and an exported variable set at step 5."""
    actions = []
    for step in range(1, 51):
        if step == 5:
            actions.append("mkdir -p /app/work && cd /app/work && export BASE=100")
        elif step == 50:
            actions.append(SOLVE)
        else:
            pause = f"sleep {PAUSE_S}; " if step in (31, 41) else ""
            actions.append(f"{pause}echo $((BASE + {step})) >> steps.txt; echo step {step}")
    return actions


def write_actions(path: Path, actions: list[str]) -> Path:
    path.write_text("".join(json.dumps({"action": action}) + "\n" for action in actions))
    return path


def journal_of(run_dir: Path) -> Path:
    return run_dir / "episodes" / TASK / "0-journal.jsonl"


def journalled(journal: Path, kind: str, step: int) -> bool:
    if not journal.exists():
        return False
    for line in journal.read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if record.get("type") == kind and record.get("step") == step:
            return True
    return False


def kill_after(tmp_path: Path, store: Path | None, run_dir: Path, overrides: list[str], kind: str, step: int) -> None:
    """Run the runner until the journal holds a ``kind`` record of ``step``, then SIGKILL its process group
    (``store``: the local backend's; None for another backend)."""
    command = [
        sys.executable, "-m", "benchmarks.run", f"suite.include=[{TASK}]",
        *([f"backend.store_dir={store}"] if store is not None else []), f"output_dir={run_dir}",
        f"hydra.run.dir={tmp_path / 'hydra'}", "progress=false", "benchmark.plots=false", *overrides,
    ]  # fmt: skip
    with (tmp_path / f"runner-{time.monotonic_ns()}.log").open("w") as log:
        proc = subprocess.Popen(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 300  # a first Docker run builds the task's image
        while not journalled(journal_of(run_dir), kind, step):
            assert proc.poll() is None, f"the runner ended before step {step} was journalled: {log.name}"
            assert time.monotonic() < deadline, f"step {step} was never journalled"
            time.sleep(0.02)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def results(run_dir: Path) -> list[dict[str, Any]]:
    records = [json.loads(line) for line in (run_dir / "ledger.jsonl").read_text().splitlines()]
    return [record for record in records if record["kind"] == "result"]


def commands(run_dir: Path, result: dict[str, Any]) -> list[str]:
    trajectory = json.loads((run_dir / result["files"]["trajectory"]).read_text())
    calls = [call for step in trajectory["steps"][1:] for call in step["tool_calls"]]
    return [call["arguments"].get("command", "submit") for call in calls]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory, runner_store: Path) -> tuple[Path, dict[str, Any]]:
    """The scripted episode played through once, with the same checkpoints."""
    tmp = tmp_path_factory.mktemp("uninterrupted")
    actions = write_actions(tmp / "actions.jsonl", shell_script())
    run = run_benchmark(tmp, runner_store, "agent=replay", f"agent.path={actions}", "checkpoint_every=10")
    run.summary()
    return run.run_dir, run.result()


def test_an_episode_killed_at_step_30_goes_on_from_step_30_and_ends_as_the_uninterrupted_run(
    tmp_path: Path, runner_store: Path, uninterrupted: tuple[Path, dict[str, Any]]
) -> None:
    whole_dir, whole = uninterrupted
    assert (whole["outcome"], whole["reward"], whole["steps"], whole["checkpoints"]) == ("scored", 1.0, 50, 4)
    assert whole["end_digest"] and whole.get("resumed_from_step") is None

    run_dir = tmp_path / "run"
    actions = write_actions(tmp_path / "actions.jsonl", shell_script())
    overrides = ["agent=replay", f"agent.path={actions}", "checkpoint_every=10"]
    kill_after(tmp_path, runner_store, run_dir, overrides, "checkpoint", 30)  # killed in step 31
    kill_after(tmp_path, runner_store, run_dir, ["resume=true"], "checkpoint", 40)  # killed in step 41
    done = run_benchmark(tmp_path, runner_store, "resume=true", name="run")
    summary = done.summary()
    assert summary["counts"]["interrupted_attempts"] == 2
    assert (summary["counts"]["resumed_at_checkpoint"], summary["counts"]["steps_replayed"]) == (1, 0)

    (resumed,) = results(run_dir)
    assert resumed["attempt"] == 3
    assert (resumed["resumed_from_step"], resumed["steps_replayed"]) == (40, 0)
    assert (resumed["outcome"], resumed["reward"], resumed["steps"], resumed["end_reason"]) == (
        "scored", whole["reward"], 50, whole["end_reason"],
    )  # fmt: skip
    assert resumed["end_digest"] == whole["end_digest"]  # the same files, byte for byte
    assert resumed["changes"] == whole["changes"]  # the whole episode's changes, not the last part's
    assert (resumed["start_digest"], resumed["snapshot_id"]) == (whole["start_digest"], whole["snapshot_id"])
    assert commands(run_dir, resumed) == commands(whole_dir, whole) == shell_script()

    journal = EpisodeJournal(journal_of(run_dir)).load()
    assert (journal.attempt, journal.ended) == (3, "scored")
    kinds = [json.loads(line)["type"] for line in journal_of(run_dir).read_text().splitlines()]
    assert kinds.count("start") == 1 and kinds.count("resumed") == 2  # played once from the start, never again


@pytest.mark.docker
def test_a_docker_episode_goes_on_from_the_checkpoint_its_killed_runner_left(tmp_path: Path) -> None:
    """On Docker a checkpoint is an image: the killed runner's stays (it carries the run), the resume goes on
    from it and adopts the run's leftovers, and no checkpoint image of the run is left once it ended."""
    need_backend("docker")
    name = f"durable-{secrets.token_hex(4)}"
    run_dir = tmp_path / name
    actions = write_actions(tmp_path / "actions.jsonl", shell_script())
    overrides = ["backend=docker", "agent=replay", f"agent.path={actions}", "checkpoint_every=10"]
    kill_after(tmp_path, None, run_dir, overrides, "checkpoint", 30)  # killed in step 31
    assert run_checkpoints(name), "the killed runner's checkpoints are gone"
    done = run_benchmark(tmp_path, None, "backend=docker", "resume=true", name=name, timeout_s=300)
    assert done.done.returncode == 0, done.done.stderr[-3000:]
    (result,) = results(run_dir)
    assert (result["outcome"], result["reward"], result["steps"]) == ("scored", 1.0, 50)
    assert (result["resumed_from_step"], result["steps_replayed"], result.get("resume_failed")) == (30, 0, None)
    assert commands(run_dir, result) == shell_script()
    assert run_checkpoints(name) == []


def run_checkpoints(run: str) -> list[str]:
    """The Docker engine's checkpoint images of a run."""
    import docker

    client = docker.from_env()
    try:
        return [image.id for image in client.images.list(filters={"label": [f"{RUN}={run}"]})]
    finally:
        client.close()


def test_a_python_episode_is_played_again_from_its_start_and_says_how_many_steps(
    tmp_path: Path, runner_store: Path
) -> None:
    """Python-v0 keeps its variables in the interpreter's process, which no checkpoint holds."""
    cells = [f"x{i} = {i}" for i in range(1, 11)]
    cells += ["import time; time.sleep(3)", "import subprocess", f"subprocess.run({SOLVE!r}, shell=True, check=True)"]
    actions = write_actions(tmp_path / "cells.jsonl", cells)
    run_dir = tmp_path / "run"
    kill_after(tmp_path, runner_store, run_dir, ["env=python", "agent=replay", f"agent.path={actions}",
                                                  "checkpoint_every=2"], "step", 10)  # fmt: skip
    assert not journalled(journal_of(run_dir), "checkpoint", 10)
    summary = run_benchmark(tmp_path, runner_store, "resume=true", name="run").summary()
    assert summary["counts"]["resumed_at_checkpoint"] == 0 and summary["counts"]["steps_replayed"] >= 10
    (result,) = results(run_dir)
    assert (result["outcome"], result["reward"], result["checkpoints"]) == ("scored", 1.0, 0)
    assert result["steps_replayed"] >= 10 and result.get("resumed_from_step") is None


def test_a_checkpoint_whose_digest_does_not_match_is_not_trusted(tmp_path: Path, runner_store: Path) -> None:
    """A journal edited to name another digest: the restored state is not what was journalled, so the
    episode is played again from the task's snapshot (and the result says why)."""
    run_dir = tmp_path / "run"
    actions = write_actions(tmp_path / "actions.jsonl", shell_script())
    kill_after(tmp_path, runner_store, run_dir, ["agent=replay", f"agent.path={actions}", "checkpoint_every=10"],
               "checkpoint", 30)  # fmt: skip
    journal = journal_of(run_dir)
    lines = journal.read_text().splitlines()
    forged = []
    for line in lines:
        record = json.loads(line)
        if record["type"] == "checkpoint":
            record["snapshot"]["digest"] = "0" * 64
        forged.append(json.dumps(record))
    journal.write_text("\n".join(forged) + "\n")
    run_benchmark(tmp_path, runner_store, "resume=true", name="run", timeout_s=180).summary()
    (result,) = results(run_dir)
    assert "digest" in result["resume_failed"] and result.get("resumed_from_step") is None
    assert result["steps_replayed"] == 30
    assert (result["outcome"], result["reward"], result["steps"]) == ("scored", 1.0, 50)


def test_a_model_agent_goes_on_with_its_conversation_not_a_new_one(
    chat_server: ChatServer, tmp_path: Path, runner_store: Path
) -> None:
    """agent=llm declares its messages: after the kill, the model is asked once more at step 4 with the
    whole conversation so far, and is never asked again for the turns before the checkpoint."""

    def reply(request: ChatRequest) -> str:
        turn = sum(1 for message in request.messages if message["role"] == "assistant")
        if turn < 4:
            return f"```bash\necho turn {turn} >> /app/turns.txt\n```"
        if turn == 4:
            return f"```bash\nsleep {PAUSE_S}; echo turn 4 >> /app/turns.txt\n```"
        return f"```bash\n{SOLVE}\n```" if turn == 5 else "submit"

    chat_server.script(reply)
    run_dir = tmp_path / "run"
    agent = ["agent=llm", f"agent.base_url={chat_server.base_url}", "agent.model=scripted", "agent.api_key_env=",
             "checkpoint_every=2"]  # fmt: skip
    kill_after(tmp_path, runner_store, run_dir, agent, "checkpoint", 4)
    asked_before_kill = len(chat_server.completions())
    run_benchmark(tmp_path, runner_store, "resume=true", name="run").summary()
    (result,) = results(run_dir)
    assert (result["outcome"], result["reward"], result["resumed_from_step"], result["steps_replayed"]) == (
        "scored", 1.0, 4, 0,
    )  # fmt: skip
    after = chat_server.completions()[asked_before_kill:]
    turns = [sum(1 for m in request.messages if m["role"] == "assistant") for request in after]
    assert turns == [4, 5, 6]  # the conversation went on at turn 4
    conversation = after[0].messages
    assert [m["content"] for m in conversation if m["role"] == "assistant"] == [
        f"```bash\necho turn {turn} >> /app/turns.txt\n```" for turn in range(4)
    ]
    assert conversation[-1]["role"] == "user" and "exit code 0" in conversation[-1]["content"]
    trajectory = json.loads((run_dir / result["files"]["trajectory"]).read_text())
    assert [step["message"] for step in trajectory["steps"][1:5]] == [
        f"```bash\necho turn {turn} >> /app/turns.txt\n```" for turn in range(4)
    ]


class LosesItsSandboxOnce(ReplayAgent):
    """The replay agent, except that before its action ``lose_at`` the sandbox's init is SIGKILLed from the
    host, once: the infrastructure failing mid-episode, as a host or a node does."""

    def __init__(self, actions: list[str], lose_at: int, lose: Callable[[Any], None] = kill_init_from_the_host) -> None:
        super().__init__(actions=actions)
        self.lose_at, self.lost, self.lose = lose_at, False, lose

    def start(self, episode: EpisodeContext) -> Any:
        return self._watch(super().start(episode), episode)

    def resume(self, episode: EpisodeContext, state: Mapping[str, Any]) -> Any:
        return self._watch(super().resume(episode, state), episode)

    def _watch(self, policy: Any, episode: EpisodeContext) -> Any:
        act = policy.act

        def act_after_the_loss(observation: Any, info: Any) -> str:
            if policy.position + 1 == self.lose_at and not self.lost:
                self.lost = True
                self.lose(episode.env.unwrapped)
            return str(act(observation, info))

        policy.act = act_after_the_loss
        return policy


def test_an_attempt_whose_sandbox_died_goes_on_from_the_last_checkpoint(tmp_path: Path, store_dir: Path) -> None:
    agent = LosesItsSandboxOnce([*shell_script()[:30], SOLVE, "submit"], lose_at=25)
    with LocalBackend(store_dir=store_dir) as backend:
        evaluate(tmp_path, [load_task(TASK)], agent, backend, checkpoint_every=10, concurrency=1, max_attempts=2)
    (result,) = results(tmp_path)
    assert (result["attempt"], result["infra_failures"], result["outcome"], result["reward"]) == (2, 1, "scored", 1.0)
    assert (result["resumed_from_step"], result["steps_replayed"], result["steps"]) == (20, 0, 31)
    assert agent.lost


def kill_the_container(env: Any) -> None:
    """The Docker engine kills the sandbox's container (a crashed container, an engine that lost it)."""
    import docker

    client = docker.from_env()
    try:
        client.api.kill(env.sandbox.container_id)
    finally:
        client.close()


@pytest.mark.docker
def test_a_docker_episode_left_unscored_keeps_its_checkpoints_for_the_runs_resume(tmp_path: Path) -> None:
    """A run that ends with an episode unscored by its infrastructure (its attempts spent) keeps that
    episode's checkpoint images past its backend's close; the resume goes on from them and removes them."""
    need_backend("docker")
    from pool.backends.docker import DockerBackend

    name = f"durable-{secrets.token_hex(4)}"
    run_dir, actions = tmp_path / name, [*shell_script()[:30], SOLVE, "submit"]
    settings: dict[str, Any] = {"checkpoint_every": 10, "max_attempts": 1, "run_id": name}
    with DockerBackend() as backend:
        evaluate(run_dir, [load_task(TASK)], LosesItsSandboxOnce(actions, 25, kill_the_container), backend, **settings)
    (unscored,) = results(run_dir)
    assert (unscored["outcome"], unscored["steps"]) == ("infra_error", 25)  # the 25th found its container dead
    assert len(run_checkpoints(name)) == 2  # steps 10 and 20
    with DockerBackend() as backend:
        evaluate(run_dir, [load_task(TASK)], ReplayAgent(actions=actions), backend, **settings)
    resumed = results(run_dir)[-1]
    assert (resumed["outcome"], resumed["reward"], resumed["attempt"]) == ("scored", 1.0, 2)
    assert (resumed["resumed_from_step"], resumed["steps_replayed"]) == (20, 0)
    assert run_checkpoints(name) == []


def test_a_resume_started_while_the_run_still_goes_is_refused(tmp_path: Path, runner_store: Path) -> None:
    """Two runners on one ledger would play the same episodes twice: the second stops before any sandbox."""
    run_dir = tmp_path / "run"
    actions = write_actions(tmp_path / "actions.jsonl", ["echo 1", "sleep 30", SOLVE])
    command = [
        sys.executable, "-m", "benchmarks.run", f"suite.include=[{TASK}]", f"backend.store_dir={runner_store}",
        f"output_dir={run_dir}", f"hydra.run.dir={tmp_path / 'hydra'}", "progress=false", "agent=replay",
        f"agent.path={actions}", "checkpoint_every=1",
    ]  # fmt: skip
    first = subprocess.Popen(command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not journalled(journal_of(run_dir), "checkpoint", 1):
            assert first.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        second = run_benchmark(tmp_path, runner_store, "resume=true", name="run")
        assert second.done.returncode == 2, second.done.stderr[-2000:]
        assert "another runner is writing" in second.done.stderr
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
    (tmp_path / "actions.jsonl").write_text(json.dumps({"action": "true"}))  # the resume need not sleep again
    third = run_benchmark(tmp_path, runner_store, "resume=true", name="run")  # the kill released the lock
    assert third.summary()["counts"]["finished"] == 1


def test_an_agent_that_makes_its_checkpoints_too_large_only_loses_them(tmp_path: Path, store_dir: Path) -> None:
    """A file over the store's snapshot limit: every checkpoint fails and says why; the episode goes on and
    is scored (it would be played from its start after a kill, as without checkpoints)."""
    agent = ReplayAgent(actions=["head -c 3M /dev/urandom > /app/ballast", "echo on", SOLVE, "submit"])
    with LocalBackend(store_dir=store_dir, max_snapshot_mb=1) as backend:
        evaluate(tmp_path, [load_task(TASK)], agent, backend, checkpoint_every=1)
    (result,) = results(tmp_path)
    assert (result["outcome"], result["reward"], result["checkpoints"]) == ("scored", 1.0, 0)
    failed = [json.loads(line) for line in journal_of(tmp_path).read_text().splitlines()]
    failed = [record for record in failed if record["type"] == "checkpoint_failed"]
    assert [record["step"] for record in failed] == [1, 2, 3]
    assert all("SnapshotTooLargeError" in record["error"] for record in failed)


# -- the environment's side ----------------------------------------------------------------------


def test_a_resumed_episode_keeps_its_step_count_and_agent_clock(store_dir: Path) -> None:
    """resume_at gives no extra steps or time: max_steps and the agent timeout count from the first start."""
    options = {"backend_options": {"store_dir": store_dir}, "max_steps": 5}
    with gym.make("snapgym/Shell-v0", task=TASK, **options) as env:
        env.reset(seed=0)
        env.step("cd /tmp && export KEPT=yes && echo one > /app/one")
        env.step("echo two > /app/two")
        snapshot = env.unwrapped.checkpoint()
        changes = env.unwrapped.episode_changes()
    with gym.make("snapgym/Shell-v0", task=TASK, **options) as env:
        _, info = env.reset(options={"snapshot": snapshot, "resume_at": {"step": 2, "elapsed_s": 7.0,
                                                                           "changes": changes}})  # fmt: skip
        assert (info["started_at"], info["resumed_at_step"], info["start_digest"]) == ("checkpoint", 2, snapshot.digest)
        assert env.unwrapped.elapsed_s >= 7.0
        obs, _, _, truncated, info = env.step("pwd; echo $KEPT; cat /app/one")
        assert obs["output"].split()[:3] == ["/tmp", "yes", "one"] and not truncated
        env.step("true")
        _, _, terminated, truncated, info = env.step("rm /app/one")
        assert (info["step"], info["end_reason"], terminated, truncated) == (5, "max_steps", False, True)
        assert {"/app/two"} <= set(info["changes"]["added"]) and "/app/one" not in str(info["changes"])


@pytest.mark.parametrize(
    ("resume_at", "error"),
    [
        ({"step": 50}, "step count"),
        ({"step": -1}, "step count"),
        ({"step": True}, "step count"),
        ({"step": 1, "elapsed_s": float("nan")}, "elapsed_s"),
        ({"step": 1, "when": 3}, "takes step"),
    ],
)
def test_a_bad_resume_point_is_refused_by_name(store_dir: Path, resume_at: dict[str, Any], error: str) -> None:
    with gym.make("snapgym/Shell-v0", task=TASK, backend_options={"store_dir": store_dir}) as env:
        env.reset(seed=0)
        snapshot = env.unwrapped.checkpoint()
        with pytest.raises(ConfigError, match=error):
            env.reset(options={"snapshot": snapshot, "resume_at": resume_at})
        with pytest.raises(ConfigError, match="needs options"):
            env.reset(options={"resume_at": {"step": 1}})


# -- the journal and the changes -----------------------------------------------------------------


def checkpoint(attempt: int, step: int) -> Checkpoint:
    return Checkpoint(attempt=attempt, step=step, snapshot={"id": f"s{step}"}, agent_state={"position": step},
                      elapsed_s=1.0, episode_s=1.0, agent_s=0.1, env_s=0.5, changes=None,
                      trajectory={"total_steps": step}, observation={"output": "", "exit_code": 0},
                      info={"step": step})  # fmt: skip


def test_the_journal_follows_the_chain_of_attempts_and_skips_a_torn_line(tmp_path: Path) -> None:
    journal = EpisodeJournal(tmp_path / "j.jsonl")
    journal.start(1, {"start_digest": "d0"})
    for step in range(1, 36):
        journal.step(1, step, {"step_id": step + 1, "attempt": 1})
        if step % 10 == 0:
            journal.checkpoint(checkpoint(1, step))
    first = journal.load()
    assert (first.ended, first.steps_reached, first.checkpoint and first.checkpoint.step) == (None, 35, 30)
    assert first.can_go_on and len(first.steps) == 30
    journal.resumed(2, checkpoint(1, 30))
    for step in range(31, 45):
        journal.step(2, step, {"step_id": step + 1, "attempt": 2})
        if step == 40:
            journal.checkpoint(checkpoint(2, 40))
    with journal.path.open("a") as file:
        file.write('{"type":"checkpoint","attempt":2,"step":44,"snap')  # killed mid-write
    journal = EpisodeJournal(journal.path)  # the next run's
    state = journal.load()
    assert (state.attempt, state.checkpoint and state.checkpoint.step, state.start) == (2, 40, {"start_digest": "d0"})
    assert [entry["attempt"] for entry in state.steps] == [1] * 30 + [2] * 10
    journal.end(2, "agent_error")
    assert not journal.load().can_go_on  # an attempt that ended is never gone on from
    journal.start(3, {"start_digest": "d0"})
    assert journal.load().checkpoint is None  # a fresh start forgets the old chain


def test_changes_after_a_checkpoint_compose_into_the_whole_episodes() -> None:
    before = Changes("host", added=("/w/a", "/w/d/", "/w/d/f"), changed=("/w/x",), removed=("/w/old",))
    after = Changes("host", added=("/w/old", "/w/n"), changed=("/w/a", "/w/y"), removed=("/w/d/", "/w/x"))
    whole = after.after(before)
    assert (whole.added, whole.changed, whole.removed) == (("/w/a", "/w/n"), ("/w/old", "/w/y"), ("/w/x",))
    assert after.after(Changes("host", truncated=True)).truncated
