"""The end-state diff of an episode (``info["changes"]``): what the agent added, changed and removed,
listed on the host from the sandbox's writable layer, so that the agent can neither hide nor forge it."""

from __future__ import annotations

import time
from typing import Any

import gymnasium as gym
import pytest

import envs
from pool import LocalBackend, Template
from pool.backends.local.store.changes import read_changes
from tests.support.fixtures.envs_fixtures import SOLVE, TASK


def play(env: gym.Env[dict[str, Any], str], *actions: str) -> dict[str, Any]:
    """One episode of ``actions`` then submit; the last step's info."""
    env.reset()
    for action in actions:
        env.step(action)
    *_, info = env.step(envs.SUBMIT)
    return info


def test_a_shell_episode_lists_what_the_agent_left_and_not_snapgyms_own_files(backend: LocalBackend) -> None:
    env = gym.make("snapgym/Shell-v0", task=TASK, backend=backend)
    try:
        info = play(env, "cd /app && export X=1", SOLVE, "rm access.log; mkdir -p out/sub; touch out/sub/f")
        assert info["changes"] == {
            "source": "host",
            "added": ["/app/answer.txt", "/app/out/", "/app/out/sub/", "/app/out/sub/f"],
            "changed": [],
            "removed": ["/app/access.log"],
            "counts": {"added": 4, "changed": 0, "removed": 1},
            "truncated": False,
        }
        nothing = {"added": 0, "changed": 0, "removed": 0}
        assert play(env)["changes"]["counts"] == nothing  # the shell's own state file is not the agent's
    finally:
        env.close()


def test_a_python_episode_leaves_out_the_interpreter_server(backend: LocalBackend) -> None:
    env = gym.make("snapgym/Python-v0", task=TASK, backend=backend)
    try:
        info = play(env, "open('/app/answer.txt', 'w').write('127\\n')", "open('/app/access.log', 'a').write('x')")
        assert (info["changes"]["added"], info["changes"]["changed"]) == (["/app/answer.txt"], ["/app/access.log"])
    finally:
        env.close()


def test_an_agent_that_stops_every_new_process_cannot_hide_its_files(backend: LocalBackend) -> None:
    """The listing runs no process in the sandbox: a loop that SIGSTOPs everything new changes nothing."""
    env = gym.make("snapgym/Shell-v0", task=TASK, backend=backend, step_timeout_s=5)
    try:
        env.reset()
        env.step("echo 1 > /app/answer.txt; (setsid sh -c 'while :; do for p in /proc/[0-9]*; do "
                 "kill -STOP ${p#/proc/} 2>/dev/null; done; done' >/dev/null 2>&1 &)")  # fmt: skip
        started = time.monotonic()
        changes = env.unwrapped.sandbox.changes()  # type: ignore[attr-defined]
        assert "/app/answer.txt" in changes.added and time.monotonic() - started < 5
    finally:
        env.close()


def test_lists_are_capped_and_a_huge_tree_stops_the_walk_and_says_so(backend: LocalBackend) -> None:
    snapshot = backend.build(Template(name="diff-cap", setup=["mkdir -p /w"], workdir="/w"))
    with backend.create(snapshot) as sandbox:
        sandbox.exec("mkdir many && cd many && seq 1 400 | xargs touch && echo x > /w/z")
        capped = sandbox.changes(max_paths=10)
        assert len(capped.added) == 10 and capped.counts["added"] == 402 and capped.truncated
        upper = backend.stage_dir(sandbox) / "upper"  # type: ignore[arg-type]
        layers = [backend.store.layers.path(layer) for layer in snapshot.layers]
        walked = read_changes(upper, layers, rootless=backend.rootless, max_entries=50)
        assert walked.truncated and walked.counts["added"] < 60


def test_links_in_the_layer_are_listed_never_followed(backend: LocalBackend) -> None:
    """A link to a host path, or a folder swapped for a link, is a path like any other: the host walk
    does not follow it."""
    snapshot = backend.build(Template(name="diff-links", setup=["mkdir -p /w/d", "echo a > /w/d/f"], workdir="/w"))
    with backend.create(snapshot) as sandbox:
        sandbox.exec("ln -s / /w/root; rm -r /w/d && ln -s /etc /w/d; ln -s /proc/1/root /w/host")
        changes = sandbox.changes()
        assert changes.added == ("/w/host", "/w/root") and changes.changed == ("/w/d",)
        assert changes.counts == {"added": 2, "changed": 1, "removed": 0}


@pytest.mark.parametrize("kind", ["added", "changed", "removed"])
def test_without_drops_paths_and_their_counts(kind: str) -> None:
    from pool.changes import Changes

    changes = Changes("host", **{kind: ("/a", "/b")}, counts={kind: 5})  # type: ignore[arg-type]
    assert changes.without(frozenset({"/a"})).as_dict()["counts"][kind] == 4
