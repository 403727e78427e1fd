"""A Terminal-Bench-2-shaped task whose verbatim test.sh downloads its tools at verify time.

With the task's own policy (public, Harbor's default) the oracle scores 1.0 and doing nothing 0.0;
with ``network=offline`` the episode is unscored (``network_denied``, naming the hosts) instead
of a silent 0.0; an agent that wants its failure hidden cannot get there by trying a forbidden host
from code the tests run. The run's ledger, per-episode files and summary say the same.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest

import envs  # noqa: F401 (registers the environments)
from pool import BuildError, LocalBackend
from tests.support.backends import LIMITS
from tests.support.fixtures.net_fixtures import TestInternet, egress_options, publish_installer, publish_wheel
from tests.support.fixtures.runner_fixtures import REPO

pytest_plugins = ["tests.support.fixtures.net_fixtures"]

TEST_SH = """\
#!/bin/bash
# As Terminal-Bench 2 test scripts do: fetch the tools at verify time.
curl -LsSf https://astral.sh/uv/0.9.5/install.sh | sh
source $HOME/.local/bin/env
sgtool || { echo 0 > /logs/verifier/reward.txt; exit 1; }
python3 -m pip install -q --index-url https://pypi.org/simple --target /tmp/checker sgcheck==1.0 \\
  || { echo 0 > /logs/verifier/reward.txt; exit 1; }
if PYTHONPATH=/tmp/checker python3 -m sgcheck /app/answer.txt; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
"""
CHECKER = """\
import sys
def main():
    ok = open(sys.argv[1]).read().strip() == "hello, network"
    print("sgcheck:", "pass" if ok else "fail")
    sys.exit(0 if ok else 1)
if __name__ == "__main__":
    main()
"""


def write_task(folder: Path, *, environment: str = "", verifier: str = "") -> Path:
    """A task in Harbor's layout; unless told otherwise its task.toml says nothing about the network
    (so: public), ``environment`` and ``verifier`` are more lines of those tables."""
    (folder / "environment").mkdir(parents=True)
    (folder / "tests").mkdir()
    (folder / "solution").mkdir()
    (folder / "instruction.md").write_text("Write 'hello, network' to /app/answer.txt.\n")
    (folder / "task.toml").write_text(
        f'version = "1.0"\n\n[verifier]\ntimeout_sec = 120.0\n{verifier}\n[environment]\n{environment}\n'
    )
    (folder / "environment" / "Dockerfile").write_text("FROM snapgym/host\nWORKDIR /app\n")
    (folder / "tests" / "test.sh").write_text(TEST_SH)
    (folder / "solution" / "solve.sh").write_text("#!/bin/bash\necho 'hello, network' > /app/answer.txt\n")
    return folder


@pytest.fixture(scope="module")
def published(internet: TestInternet) -> TestInternet:
    publish_installer(internet, path="/uv/0.9.5/install.sh")
    publish_wheel(internet, "sgcheck", "1.0", CHECKER)
    return internet


@pytest.fixture(scope="module")
def net_local(published: TestInternet, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalBackend]:
    store = tmp_path_factory.mktemp("store")
    with LocalBackend(store_dir=store, **LIMITS, egress=egress_options(published)) as backend:
        yield backend


@pytest.fixture(scope="module")
def task_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_task(tmp_path_factory.mktemp("tasks") / "download-at-verify")


def play(backend: LocalBackend, task: Path, actions: list[str], **options: Any) -> tuple[float, dict[str, Any]]:
    env = gym.make("snapgym/Shell-v0", task=task, backend=backend, **options)
    try:
        env.reset()
        reward, info = 0.0, {}
        for action in [*actions, "submit"]:
            _, reward, terminated, truncated, info = env.step(action)
            if terminated or truncated:
                break
        return float(reward), info
    finally:
        env.close()


SOLVE = "echo 'hello, network' > /app/answer.txt"


def test_with_the_tasks_policy_the_oracle_scores_1_and_noop_0(net_local: LocalBackend, task_dir: Path) -> None:
    reward, info = play(net_local, task_dir, [SOLVE])
    assert (reward, info["scored"]) == (1.0, True), info["verifier"]["output"]
    hosts = {(c["host"], c["verdict"], c["phase"]) for c in info["network"]["connections"]}
    assert {("astral.sh", "allowed", "verifier"), ("pypi.org", "allowed", "verifier"),
            ("files.pythonhosted.org", "allowed", "verifier")} <= hosts  # fmt: skip
    assert info["network"]["policy"]["verifier"]["network_mode"] == "public"
    reward, info = play(net_local, task_dir, [])
    assert (reward, info["scored"]) == (0.0, True)


def test_offline_is_unscored_network_denied_not_a_silent_zero(net_local: LocalBackend, task_dir: Path) -> None:
    reward, info = play(net_local, task_dir, [SOLVE], network="offline")
    assert reward == 0.0 and info["scored"] is False
    assert info["unscored_reason"] == "network_denied"
    assert info["network_failure"]["hosts"][0] == "astral.sh:443"
    assert "network" in info["network_failure"]["hint"]


def test_verify_time_downloads_replay_offline_from_a_recording(
    published: TestInternet, task_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Record once with the internet there; then, with every name pointing nowhere, the same
    verification replays from the cache (1.0 for the oracle, 0.0 for doing nothing) without a
    request reaching an origin, and a download that was never recorded is ``network_denied``."""
    store, folder = tmp_path_factory.mktemp("store"), tmp_path_factory.mktemp("download-cache")
    recording = {**egress_options(published), "cache": {"mode": "record", "dir": str(folder)}}
    with LocalBackend(store_dir=store, **LIMITS, egress=recording) as backend:
        reward, info = play(backend, task_dir, [SOLVE])
    assert (reward, info["scored"]) == (1.0, True), info["verifier"]["output"]
    verifier = [c for c in info["network"]["connections"] if c["phase"] == "verifier"]
    assert {c["cache"] for c in verifier} == {"stored"} and len(verifier) >= 3

    reached = len(published.requests())
    nowhere = published.network.replace(".0/24", ".200")  # in the trusted network, and nothing there
    replaying = {**egress_options(published), "hosts": dict.fromkeys(published.hosts, nowhere),
                 "cache": {"mode": "replay", "dir": str(folder)}}  # fmt: skip
    with LocalBackend(store_dir=store, **LIMITS, egress=replaying) as backend:
        reward, info = play(backend, task_dir, [SOLVE])
        assert (reward, info["scored"]) == (1.0, True), info["verifier"]["output"]
        verifier = [c for c in info["network"]["connections"] if c["phase"] == "verifier"]
        assert {(c["verdict"], c["cache"], c["bytes_up"]) for c in verifier} == {("allowed", "hit", 0)}
        assert play(backend, task_dir, [])[0] == 0.0

        installer = "https://astral.sh/uv/0.9.5/install.sh"
        for entry in (folder / "index").glob("*.json"):
            if json.loads(entry.read_text())["request"]["url"] == installer:
                entry.unlink()
        reward, info = play(backend, task_dir, [SOLVE])
    assert (reward, info["scored"], info["unscored_reason"]) == (0.0, False, "network_denied")
    assert info["network_failure"]["hosts"][0] == "astral.sh:443" and installer in info["network_failure"]["hint"]
    first = min((c for c in info["network"]["connections"] if c["phase"] == "verifier"), key=lambda c: c["time"])
    assert (first["verdict"], first["rule"], first["cache"]) == ("denied", f"replay miss: {installer}", "miss")
    assert len(published.requests()) == reached


def test_an_agent_cannot_hide_a_failure_behind_a_refused_host(net_local: LocalBackend, task_dir: Path) -> None:
    """Shared verification: a process the agent leaves running makes the verifier's first attempt a
    refused one. The wrong answer still scores 0.0 (a hint says what the network refused)."""
    allow = ["astral.sh", "pypi.org", "files.pythonhosted.org"]  # test.sh's downloads, not the agent's host
    sabotage = ("echo wrong > /app/answer.txt; (setsid sh -c 'while :; do curl -s -m 2 https://example.com/ "
                ">/dev/null 2>&1; sleep 0.05; done' >/dev/null 2>&1 &)")  # fmt: skip
    reward, info = play(net_local, task_dir, [sabotage], network=allow, verification="shared")
    assert (reward, info["scored"]) == (0.0, True)
    verifier = [c for c in info["network"]["connections"] if c["phase"] == "verifier"]
    assert any(c["host"] == "example.com" and c["verdict"] == "denied" for c in verifier)
    assert "unscored_reason" not in info


def test_the_task_toml_policy_is_read_per_phase(net_local: LocalBackend, tmp_path: Path) -> None:
    task = write_task(
        tmp_path / "phased",
        environment='network_mode = "no-network"',
        verifier='network_mode = "allowlist"\nallowed_hosts = ["astral.sh", "pypi.org", "*.pythonhosted.org"]',
    )
    probe = "curl -sS -m 5 -o /dev/null -w '%{http_code}' https://pypi.org/simple/ 2>&1; echo"
    env = gym.make("snapgym/Shell-v0", task=task, backend=net_local)
    try:
        _, info = env.reset()
        assert info["network"]["agent"]["network_mode"] == "no-network"
        obs, *_ = env.step(probe)
        assert "403" in obs["output"]  # the agent may not
        env.step(SOLVE)
        _, reward, _, _, info = env.step("submit")
    finally:
        env.close()
    assert reward == 1.0  # the verifier may
    agent = [c for c in info["network"]["connections"] if c["phase"] == "agent"]
    assert [(c["host"], c["verdict"], c["rule"]) for c in agent] == [("pypi.org", "denied", "no-network")]


def test_the_runner_records_the_audit_and_names_the_blocked_tasks(
    published: TestInternet, task_dir: Path, tmp_path: Path
) -> None:
    import subprocess
    import sys

    hosts = ",".join(f'"{name}={address}"' for name, address in published.hosts.items())
    common = [
        sys.executable, "-m", "benchmarks.run", "suite=dir", f"suite.path={task_dir.parent}",
        f"backend.store_dir={tmp_path / 'store'}", f"backend.egress.hosts=[{hosts}]",
        f"backend.egress.trusted_networks=[{published.network}]",
        f"backend.egress.extra_ca_files=[{published.ca.cert_path}]", "progress=false", "benchmark.plots=false",
    ]  # fmt: skip
    runs = {}
    for name, network in (("task", "task"), ("offline", "offline")):
        run_dir = tmp_path / name
        done = subprocess.run([*common, f"network={network}", f"output_dir={run_dir}",
                               f"hydra.run.dir={tmp_path / (name + '-hydra')}"],
                              cwd=REPO, capture_output=True, text=True, timeout=300)  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        runs[name] = (run_dir, done)
    run_dir, _ = runs["task"]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["mean_reward"] == 1.0 and summary["network"]["allowed"] >= 3
    record = next(r for r in map(json.loads, (run_dir / "ledger.jsonl").read_text().splitlines())
                  if r["kind"] == "result")  # fmt: skip
    assert record["network"]["allowed"] >= 3 and record["network"]["policy"]["verifier"]["network_mode"] == "public"
    audit = json.loads((run_dir / record["files"]["network"]).read_text())
    assert any(c["host"] == "astral.sh" for c in audit["connections"])

    run_dir, done = runs["offline"]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["counts"]["network_denied"] == 1 and summary["mean_reward"] is None
    blocked = summary["network"]["tasks_blocked"]["download-at-verify"]
    assert blocked["outcome"] == "network_denied" and "astral.sh:443" in blocked["hosts"]
    assert "network differs from the task's" in done.stderr and "no-network (task: public)" in done.stderr
    assert "unscored download-at-verify (network_denied" in done.stdout


def test_the_build_downloads_as_harbor_builds_and_a_run_can_take_that_away(
    net_local: LocalBackend, tmp_path: Path
) -> None:
    """Dockerfile RUN steps get the public network (through the proxy, on the snapshot's record), as
    in Harbor; ``network={"build": "offline"}`` is another snapshot, whose build fails naming the host."""
    task = write_task(tmp_path / "build-downloads")
    (task / "environment" / "Dockerfile").write_text(
        "FROM snapgym/host\nWORKDIR /app\nRUN curl -fsSL https://astral.sh/uv/0.9.5/install.sh -o /app/install.sh\n"
    )
    env = gym.make("snapgym/Shell-v0", task=task, backend=net_local)
    try:
        _, info = env.reset()
        assert info["network"]["build"]["network_mode"] == "public"
        record = env.unwrapped.task_snapshot.build_network  # type: ignore[attr-defined]
        assert record["route"] == "proxy" and record["audit"]["hosts"]["allowed"] == ["astral.sh:443"]
        obs, *_ = env.step("test -s /app/install.sh && echo fetched")
        assert "fetched" in obs["output"]
    finally:
        env.close()
    with pytest.raises(BuildError, match=r"(?s)astral\.sh.*the build had no network"):
        gym.make("snapgym/Shell-v0", task=task, backend=net_local, network={"build": "offline"})


def test_envs_check_plays_the_task_under_its_network_and_names_a_network_failure(
    published: TestInternet, task_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``python -m envs.check`` plays a task as the runner does: with its own policy (public) the
    verifier downloads through the egress proxy and the task passes; offline, the line says the
    network made the oracle unscored and names the host, not "oracle scored 0.0"."""
    from envs.check import main

    given = {"store_dir": str(tmp_path / "store"), "egress": egress_options(published), **LIMITS}
    options = [arg for key, value in given.items() for arg in ("-o", f"{key}={json.dumps(value)}")]
    assert main([*options, str(task_dir)]) == 0, capsys.readouterr().out
    assert main([*options, "--network", "offline", str(task_dir)]) == 1
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if line.startswith("FAIL"))
    assert "oracle not scored: network_denied" in line and "astral.sh:443" in line, line
    assert "oracle scored 0.0" not in line


LATER_DOWNLOAD_SH = """\
#!/bin/bash
# apt-get update works first (here: the index), then the interpreter's download fails.
curl -fsS -o /dev/null https://pypi.org/simple/ || { echo 0 > /logs/verifier/reward.txt; exit 1; }
curl -fsSL -o /tmp/cpython.tar.gz https://github.com/astral-sh/python-build-standalone/cpython.tar.gz \\
  || { echo 0 > /logs/verifier/reward.txt; exit 1; }
grep -q "hello, network" /app/answer.txt && echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt
"""


def test_a_later_download_that_fails_is_never_a_silent_zero(
    published: TestInternet, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The verifier's first attempt works and a later one fails (a host that is gone: the proxy
    answers 502): the 0.0 stays scored (an agent gains nothing by causing this) but is flagged with
    the failed connection, in the episode's info, the ledger and the summary; and the runner's
    calibration, which plays the reference solution first, does not play the task at all, saying why."""
    suite = tmp_path / "suite"
    task = write_task(suite / "later-download")
    (task / "tests" / "test.sh").write_text(LATER_DOWNLOAD_SH)
    write_task(suite / "download-at-verify")  # its environment is fine: it calibrates, and is played
    nowhere = published.network.replace(".0/24", ".200")  # in the trusted network, and nothing there
    settings = egress_options(published)
    settings["hosts"] = {**settings["hosts"], "github.com": nowhere}
    with LocalBackend(store_dir=tmp_path_factory.mktemp("store"), **LIMITS, egress=settings) as backend:
        reward, info = play(backend, task, [SOLVE])
    assert (reward, info["scored"]) == (0.0, True), info["verifier"]["output"]
    first = min((c for c in info["network"]["connections"] if c["phase"] == "verifier"), key=lambda c: c["time"])
    assert (first["host"], first["verdict"]) == ("pypi.org", "allowed")  # the first-attempt rule alone is silent
    suspect = info["network_suspect"]["connections"]
    assert len(suspect) == 1 and suspect[0].startswith("github.com:443 (unreachable"), suspect

    import os
    import subprocess
    import sys

    hosts = ",".join(f'"{name}={address}"' for name, address in settings["hosts"].items())

    def run(name: str, *overrides: str) -> tuple[dict[str, Any], subprocess.CompletedProcess[str]]:
        done = subprocess.run(
            [sys.executable, "-m", "benchmarks.run", "suite=dir", f"suite.path={suite}",
             f"backend.store_dir={tmp_path / 'run-store'}", f"backend.egress.hosts=[{hosts}]",
             f"backend.egress.trusted_networks=[{published.network}]",
             f"backend.egress.extra_ca_files=[{published.ca.cert_path}]", "progress=false", "benchmark.plots=false",
             f"output_dir={tmp_path / name}", f"hydra.run.dir={tmp_path / (name + '-hydra')}", *overrides],
            cwd=REPO, capture_output=True, text=True, timeout=300,
            env={**os.environ, "SNAPGYM_CALIBRATION_DIR": str(tmp_path / "calibrations")},
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads((tmp_path / name / "summary.json").read_text()), done

    summary, done = run("flagged", "calibrate=false", "suite.include=[later-download]")
    assert summary["mean_reward"] == 0.0 and summary["counts"]["scored"] == 1  # scored: the agent's 0 stands
    flagged = summary["network"]["zeros_suspect"]["later-download"]
    assert flagged["episodes"] == 1 and flagged["connections"][0].startswith("github.com:443")
    assert "suspect later-download: 1 episode(s) scored 0.0 while the verifier's connections failed" in done.stdout

    summary, done = run("calibrated", "agent=noop")
    why = summary["skipped_tasks"]["later-download"]
    assert why.startswith("calibration: its reference solution scored 0 in this environment"), why
    assert "github.com:443" in why
    assert list(summary["by_task"]) == ["download-at-verify"] and summary["counts"]["scored"] == 1
    calibrations = json.loads((tmp_path / "calibrated" / "calibration.json").read_text())
    assert calibrations["download-at-verify"]["reached"] and not calibrations["download-at-verify"]["cached"]
    summary, _ = run("again", "agent=noop")
    again = json.loads((tmp_path / "again" / "calibration.json").read_text())
    assert again["download-at-verify"]["cached"] and not again["later-download"]["cached"]  # a failure is retried
