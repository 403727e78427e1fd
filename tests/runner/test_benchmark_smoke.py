"""Smoke tests of the benchmark runner: the real entry point, as a user runs it, on a tiny budget."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

import benchmarks
from pool.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
METHODS = {
    "restore",
    "restore_immediate",
    "create",
    "exec_true",
    "fork16",
    "verify_strict",
    "verify_shared",
    "naive_copy",
    "docker_recreate",
    "restore@docker",
    "create@docker",
}
TINY_BUDGET = [
    "benchmark.warmup=1",
    "benchmark.repetitions.restore=3",
    "benchmark.repetitions.restore_immediate=2",
    "benchmark.repetitions.create=2",
    "benchmark.repetitions.exec_true=3",
    "benchmark.repetitions.fork16=1",
    "benchmark.repetitions.verify_strict=2",
    "benchmark.repetitions.verify_shared=2",
    "benchmark.repetitions.naive_copy=2",
    "benchmark.repetitions.docker_recreate=1",
    "benchmark.repetitions.other_restore=2",
    "benchmark.repetitions.other_create=1",
    "benchmark.workspace.n_files=20",
    "benchmark.workspace.mean_file_bytes=2000",
]
EVAL_TASKS = ("log-error-count", "top-ips")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
EPISODE_COLUMNS = {
    "episode_id", "task_id", "sample", "seed", "attempt", "attempt_id", "outcome", "reward", "passed", "end_reason",
    "steps", "snapshot_id", "start_digest", "task_snapshot_digest", "reset_latency_ms", "episode_s", "agent", "backend",
}  # fmt: skip
SUMMARY_KEYS = {
    "counts", "mean_reward", "pass_rate", "pass_at_k", "by_task", "latency_ms", "throughput",
    "start_states_identical", "headline",
}  # fmt: skip


def run_benchmark(*overrides: str, multirun: bool = False) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}  # Hydra's own messages, as users see them
    return subprocess.run(
        [sys.executable, "-m", "benchmarks.run", *(["-m"] if multirun else []), *overrides],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )


@pytest.fixture(scope="module")
def shared_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One snapshot store for the runs that succeed, so each task's snapshot is built once."""
    return tmp_path_factory.mktemp("bench-store")


def is_png(path: Path) -> bool:
    return path.is_file() and path.read_bytes()[:8] == PNG_MAGIC


def test_reset_latency_reports_every_method(tmp_path: Path) -> None:
    out = tmp_path / "run"
    done = run_benchmark(
        "benchmark=reset_latency", *TINY_BUDGET, f"backend.store_dir={tmp_path / 'store'}", f"hydra.run.dir={out}"
    )
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["methods"]) == METHODS
    for name, entry in summary["methods"].items():
        if entry["skipped"]:
            assert name in ("docker_recreate", "restore@docker", "create@docker"), f"{name} skipped: {entry['reason']}"
            assert entry["reason"]
        else:
            assert entry["n"] >= 1
            assert 0 < entry["p50_ms"] <= entry["p90_ms"] <= entry["p99_ms"]
    assert set(summary["ratios"]) == {
        "restore_vs_docker", "restore_vs_naive", "docker_backend_restore_vs_recreate", "restore_vs_docker_backend"
    }  # fmt: skip
    assert summary["ratios"]["restore_vs_naive"] > 0
    assert {"restore_p50_ms", "restore_p99_ms", "exec_true_p50_ms", "fork16_p50_ms"} <= set(summary["targets"])
    assert (out / "samples.csv").read_text().startswith("method,iteration,latency_ms")
    assert "docker_recreate" in done.stdout


EGRESS_COUNTS = {
    "reset": 2, "reset_with_network": 2, "exec_true": 2, "exec_true_with_proxy_env": 2,
    "https_direct": 3, "https_via_proxy": 3, "http_direct": 3, "http_via_proxy": 3,
}  # fmt: skip
EGRESS_NEEDS_PROXY = {"reset_with_network", "exec_true_with_proxy_env", "https_via_proxy", "http_via_proxy"}


def test_egress_reports_every_method_beside_its_baseline(tmp_path: Path) -> None:
    """benchmark=egress: every method has its samples, ratios and added p50s; the proxy audited each request."""
    out = tmp_path / "run"
    done = run_benchmark(
        "benchmark=egress",
        "benchmark.warmup=1",
        "benchmark.repetitions.reset=2",
        "benchmark.repetitions.exec_true=2",
        "benchmark.repetitions.requests=3",
        f"backend.store_dir={tmp_path / 'store'}",
        f"hydra.run.dir={out}",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert list(summary["methods"]) == list(EGRESS_COUNTS)
    for name, entry in summary["methods"].items():
        if entry["skipped"]:  # a backend without an egress proxy (rootless) measures the baselines only
            assert name in EGRESS_NEEDS_PROXY and "egress proxy" in entry["reason"], f"{name}: {entry['reason']}"
        else:
            assert entry["n"] == EGRESS_COUNTS[name]
            assert 0 < entry["p50_ms"] <= entry["p90_ms"]
    pairs = [("reset", "reset_with_network"), ("exec_true", "exec_true_with_proxy_env"),
             ("https_direct", "https_via_proxy"), ("http_direct", "http_via_proxy")]  # fmt: skip
    assert set(summary["ratios"]) == {f"{b}_vs_{a}" for a, b in pairs}
    assert {f"{b}_added_p50_ms" for _, b in pairs} <= set(summary["headline"])
    audit = summary["meta"]["audit"]
    if not summary["methods"]["https_via_proxy"]["skipped"]:
        assert audit["allowed"] >= 2 * (1 + 3) and audit["denied"] == audit["unreachable"] == 0
    assert "https_via_proxy" in done.stdout and "added by the proxy" in done.stdout


@pytest.mark.parametrize("override", ["benchmark.repetitonz=3", "+benchmark.repetitonz=3"])
def test_mistyped_key_fails_before_any_sandbox(tmp_path: Path, override: str) -> None:
    store = tmp_path / "store"
    done = run_benchmark(override, f"backend.store_dir={store}", f"hydra.run.dir={tmp_path / 'run'}")
    assert done.returncode != 0
    assert "benchmark.repetitonz" in done.stderr
    assert not store.exists()
    assert not (tmp_path / "run" / "summary.json").exists()


def test_pool_benchmark_reports_every_method(tmp_path: Path) -> None:
    """benchmark=pool runs through a real Ray pool and reports latency, overhead, capacity and memory."""
    out = tmp_path / "run"
    done = run_benchmark(
        "benchmark=pool",
        "benchmark.warmup=1",
        "benchmark.min_warm=2",
        "benchmark.repetitions.acquire=5",
        "benchmark.repetitions.reset=5",
        "benchmark.repetitions.exec=5",
        "benchmark.capacity.sandboxes=8",
        f"backend.store_dir={tmp_path / 'store'}",
        f"hydra.run.dir={out}",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["methods"]) == {"acquire", "reset", "exec_lease", "exec_direct"}
    assert all(entry["n"] == 5 for entry in summary["methods"].values())
    assert summary["meta"]["capacity"]["ready"] == 8
    capacity = summary["meta"]["capacity"]  # a figure, or why there is none (the machine freed memory meanwhile)
    assert (capacity["memory_per_sandbox_mib"] or 0) > 0 or "used memory fell" in capacity["memory_note"]
    assert summary["meta"]["pool_stats"]["acquires"] >= 10
    assert set(summary["targets"]) == {"acquire_p50_ms", "exec_overhead_ms", "warm_sandboxes", "memory_per_sandbox_mib"}


def test_eval_writes_ledger_tables_summary_and_plots(tmp_path: Path, shared_store: Path) -> None:
    """The default scenario on two tasks: one ledger result and one table row per episode, a summary, three plots."""
    out = tmp_path / "run"
    done = run_benchmark(
        f"suite.include=[{','.join(EVAL_TASKS)}]",
        "episodes_per_task=2",
        "pass_at_k=[1,2]",
        f"backend.store_dir={shared_store}",
        f"hydra.run.dir={out}",
    )
    assert done.returncode == 0, done.stderr[-3000:]

    records = [json.loads(line) for line in (out / "ledger.jsonl").read_text().splitlines()]
    results = [r for r in records if r["kind"] == "result"]
    assert sorted(r["episode_id"] for r in results) == [f"{t}:{i}" for t in sorted(EVAL_TASKS) for i in (0, 1)]
    for result in results:  # each episode's folder, as Harbor's trials: result, trajectory, verifier output
        files = result["files"]
        assert files["dir"] == f"episodes/{result['task_id']}/{result['sample']}-{result['attempt']}"
        assert json.loads((out / files["result"]).read_text()) == result
        trajectory = json.loads((out / files["trajectory"]).read_text())
        assert trajectory["session_id"] == result["attempt_id"] and trajectory["steps"][0]["source"] == "user"
        assert trajectory["final_metrics"]["total_steps"] == len(trajectory["steps"]) - 1 == result["steps"] + 1
        assert trajectory["steps"][-1]["tool_calls"][0]["function_name"] == "submit"  # not a step of the count
        verdict = json.loads((out / files["verifier"]).read_text())
        assert verdict["reward"] == 1.0 and "output" not in verdict
        assert (out / files["verifier_output"]).is_file()
        diff = json.loads((out / files["diff"]).read_text())  # what the oracle left: its answer, not snapgym's files
        answer = {"log-error-count": "/app/answer.txt", "top-ips": "/app/top_ips.txt"}[result["task_id"]]
        assert diff["source"] == "host" and answer in diff["added"], diff
        assert not any(path.startswith("/run/.snapgym") for kind in ("added", "changed") for path in diff[kind])
        assert result["changes"] == {"added": 1, "changed": 0, "removed": 0, "truncated": False}  # counts only
        assert set(result["reused"]) == {"cgroup", "netns"}  # what its instance got from a dead one, proven clean

    episodes = pd.read_parquet(out / "episodes.parquet")
    assert not EPISODE_COLUMNS - set(episodes.columns)
    assert len(episodes) == 4 and episodes["attempt_id"].is_unique
    assert sorted(episodes["attempt_id"]) == sorted(r["attempt_id"] for r in results)
    assert episodes.groupby("task_id")["sample"].apply(sorted).to_dict() == {t: [0, 1] for t in EVAL_TASKS}
    assert (episodes["outcome"] == "scored").all() and (episodes["reward"] == 1.0).all()
    assert (episodes["start_digest"] == episodes["task_snapshot_digest"]).all()
    table = pd.read_csv(out / "episodes.csv")
    assert list(table.columns) == list(episodes.columns)
    assert sorted(table["attempt_id"]) == sorted(episodes["attempt_id"])

    summary = json.loads((out / "summary.json").read_text())
    assert not SUMMARY_KEYS - set(summary)
    assert summary["counts"]["scheduled"] == summary["counts"]["finished"] == summary["counts"]["scored"] == 4
    assert summary["mean_reward"] == 1.0
    assert summary["pass_at_k"] == {"1": 1.0, "2": 1.0}
    assert set(summary["by_task"]) == set(EVAL_TASKS)
    assert summary["start_states_identical"] is True
    assert summary["latency_ms"]["reset"]["n"] == summary["latency_ms"]["episode"]["n"] == 4
    kinds = episodes["reset_kind"].value_counts().to_dict()  # each environment's first reset creates
    assert set(kinds) <= {"created", "restored", "pristine"} and sum(kinds.values()) == 4
    assert (summary["latency_ms"]["restore"] or {}).get("n", 0) == kinds.get("restored", 0)
    assert summary["throughput"]["episodes"] == 4 and summary["throughput"]["episodes_per_s"] > 0
    assert {"mean_reward", "episodes_per_s", "reset_p50_ms"} <= set(summary["headline"])
    for plot in ("reward_by_task.png", "reset_latency.png", "throughput.png"):
        assert is_png(out / plot), plot

    assert "== eval: builtin with agent oracle ==" in done.stdout
    assert all(task in done.stdout for task in EVAL_TASKS)
    assert "pass@2 1.000" in done.stdout
    assert f"summary: {out / 'summary.json'}" in done.stdout
    assert f"view it: python -m benchmarks.view {out}" in done.stdout  # the run's closing lines name the viewer


def test_throughput_reports_episodes_per_second(tmp_path: Path, shared_store: Path) -> None:
    """Warm-up episodes go to their own ledger; the timed ones give a rate and a target verdict."""
    out = tmp_path / "run"
    done = run_benchmark(
        "benchmark=throughput",
        "benchmark.episodes=30",
        "benchmark.warmup_episodes=2",
        f"backend.store_dir={shared_store}",
        f"hydra.run.dir={out}",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["counts"]["finished"] == summary["counts"]["scored"] == 30
    assert summary["mean_reward"] == 1.0
    assert summary["throughput"]["episodes_per_s"] > 0
    target = summary["targets"]["episodes_per_s"]
    assert target["value"] == summary["throughput"]["episodes_per_s"] and target["met"] in (True, False)
    assert summary["method"] == {"steps": 3, "warmup_episodes": 2, "task": "trivial"}
    assert len(pd.read_parquet(out / "warmup" / "episodes.parquet")) == 2
    assert len(pd.read_parquet(out / "episodes.parquet")) == 30
    assert "target episodes/s >= 100" in done.stdout
    baseline = summary["baseline"]  # the same episodes as plain subprocesses, in the same run
    assert baseline["episodes_per_s"] > 0 and baseline["ratio"] == pytest.approx(
        baseline["episodes_per_s"] / summary["throughput"]["episodes_per_s"]
    )
    assert summary["targets"]["baseline_ratio"]["value"] == baseline["ratio"]
    assert "no-isolation baseline" in done.stdout
    for cpu in (summary["throughput"]["cpu"], baseline["cpu"]):  # machine CPU per episode: the work, not the wait
        assert cpu["busy_ms_per_episode"] > 0 and cpu["steal_ms_per_episode"] >= 0 and 0 < cpu["cores_busy"] <= 2.5
    assert "ms of machine CPU per episode" in done.stdout


def test_burst_times_concurrent_and_sequential_starts_and_time_to_first_command(
    tmp_path: Path, shared_store: Path
) -> None:
    out = tmp_path / "run"
    done = run_benchmark(
        "benchmark=burst",
        "benchmark.sizes=[2,4]",
        "benchmark.ttfc_samples=3",
        "benchmark.target_size=4",
        f"backend.store_dir={shared_store}",
        f"hydra.run.dir={out}",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert {name: entry["n"] for name, entry in summary["methods"].items()} == {
        "ttfc": 3, "sequential_2": 2, "burst_2": 2, "sequential_4": 4, "burst_4": 4,
    }  # fmt: skip
    assert all(summary["ratios"][f"burst_{n}_{kind}"] > 0 for n in (2, 4) for kind in ("per_request", "latency"))
    assert set(summary["targets"]) == {"ttfc_p50_ms", "burst_4_ratio"}


def test_idle_times_warm_steps_and_the_first_step_after_idling(tmp_path: Path, shared_store: Path) -> None:
    out = tmp_path / "run"
    done = run_benchmark(
        "benchmark=idle",
        "benchmark.sandboxes=2",
        "benchmark.warm_steps=3",
        "benchmark.idle_s=0.5",
        f"backend.store_dir={shared_store}",
        f"hydra.run.dir={out}",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert {name: entry["n"] for name, entry in summary["methods"].items()} == {"warm": 6, "after_idle": 2}
    assert summary["ratios"]["after_idle_vs_warm"] > 0 and set(summary["targets"]) == {"idle_ratio"}


def test_fork_times_checkpoint_and_each_fork(tmp_path: Path, shared_store: Path) -> None:
    out = tmp_path / "run"
    done = run_benchmark(
        "benchmark=fork",
        "benchmark.children=[1,4]",
        "benchmark.repetitions=2",
        "benchmark.warmup=1",
        f"backend.store_dir={shared_store}",
        f"hydra.run.dir={out}",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["methods"]) == {"checkpoint", "fork_1", "fork_4"}
    assert all(entry["n"] == 2 and entry["p50_ms"] > 0 for entry in summary["methods"].values())
    assert summary["meta"]["pool"] == "direct"
    assert {"fork_1_per_child_ms", "fork_4_per_child_ms", "fork_4_memory_per_child_mib"} <= set(summary["headline"])
    samples = pd.read_csv(out / "samples.csv")
    assert samples.groupby("method").size().to_dict() == {"checkpoint": 2, "fork_1": 2, "fork_4": 2}


def test_aio_compares_the_async_rollout_with_the_thread_one(tmp_path: Path, shared_store: Path) -> None:
    out = tmp_path / "run"
    done = run_benchmark(
        "benchmark=aio",
        "benchmark.in_flight=[2,4]",
        "benchmark.repetitions=1",
        "benchmark.think_s=0.01",
        "benchmark.blocking_threads=2",
        f"backend.store_dir={shared_store}",
        f"hydra.run.dir={out}",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["methods"]) == {"threads_2", "async_2", "threads_4", "async_4"}
    headline, ratios = summary["headline"], summary["ratios"]
    for key in ("threads_4", "async_4"):
        assert headline[f"{key}_episodes_per_s"] > 0 and headline[f"{key}_peak_threads"] >= 1
    assert ratios["async_over_threads_4_episodes_per_s"] > 0 and summary["meta"]["blocking_threads"] == 2


def test_multirun_combines_the_sweep(tmp_path: Path, shared_store: Path) -> None:
    """A Hydra sweep over pool.size leaves one job folder per value and a combined table and plot."""
    sweep = tmp_path / "sweep"
    done = run_benchmark(
        "benchmark=throughput",
        "pool.size=1,2",
        "benchmark.episodes=20",
        "benchmark.warmup_episodes=1",
        f"backend.store_dir={shared_store}",
        f"hydra.sweep.dir={sweep}",
        multirun=True,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    combined = pd.read_csv(sweep / "combined.csv")
    assert len(combined) == 2
    assert sorted(combined["pool.size"]) == [1, 2]
    assert (combined["episodes_per_s"] > 0).all() and (combined["mean_reward"] == 1.0).all()
    assert is_png(sweep / "combined.png")
    assert all((sweep / job / "summary.json").is_file() for job in ("0", "1"))
    assert "== multirun: 2 jobs ==" in done.stdout


BAD_INPUT = {
    "mistyped top-level key": (["episodes_per_tsk=2"], ["episodes_per_tsk"]),
    "unknown agent": (["agent=gpt"], ["gpt", "oracle", "noop", "replay", "llm"]),
    "unknown pool kind": (["pool.kind=bogus"], ["bogus", "direct", "ray"]),
    "unknown env": (["env=ruby"], ["ruby", "shell", "python"]),
    "unknown task": (["suite.include=[no-such-task]"], ["no-such-task", *EVAL_TASKS]),
    "misspelt task": (["suite.include=[log-eror-count]"], ["log-eror-count", "did you mean log-error-count"]),
    "resume of no run": (["resume=/nonexistent"], ["/nonexistent", "run.yaml"]),
    "mistyped nested key": (["pool.siz=3"], ["'pool.siz'", "did you mean size?", "max_warm"]),
    "mistyped backend option": (["backend.memory_limt_mb=64"], ["'backend.memory_limt_mb'", "memory_limit_mb"]),
    "llm without a model": (["agent=llm"], ["agent.model"]),
    "llm key not set": (
        ["agent=llm", "agent.model=m", "agent.api_key_env=SNAPGYM_SMOKE_UNSET_KEY"],
        ["SNAPGYM_SMOKE_UNSET_KEY"],
    ),
}


@pytest.mark.parametrize(("overrides", "words"), BAD_INPUT.values(), ids=BAD_INPUT.keys())
def test_bad_input_fails_before_any_sandbox(tmp_path: Path, overrides: list[str], words: list[str]) -> None:
    """A message naming the problem (and the valid choices, where there are some), no traceback, no sandbox."""
    store, out = tmp_path / "store", tmp_path / "run"
    done = run_benchmark(*overrides, f"backend.store_dir={store}", f"hydra.run.dir={out}")
    assert done.returncode != 0
    missing = [word for word in words if word not in done.stderr]
    assert not missing, f"stderr lacks {missing}:\n{done.stderr[-3000:]}"
    assert "Traceback" not in done.stderr
    assert not store.exists()
    assert not (out / "ledger.jsonl").exists() and not (out / "summary.json").exists()


def test_dir_suite_without_a_path_fails_before_any_sandbox(tmp_path: Path) -> None:
    store, out = tmp_path / "store", tmp_path / "run"
    done = run_benchmark("suite=dir", "suite.include=[top-ips]", f"backend.store_dir={store}", f"hydra.run.dir={out}")
    assert done.returncode != 0
    assert "suite.path" in done.stderr
    assert not store.exists()


def test_invalid_run_settings_are_refused_before_any_sandbox(tmp_path: Path) -> None:
    store, out = tmp_path / "store", tmp_path / "run"
    done = run_benchmark("max_steps=-1", "pool.size=0", f"backend.store_dir={store}", f"hydra.run.dir={out}")
    assert done.returncode == 2, done.stderr[-2000:]
    assert "max_steps=-1 (at least 1)" in done.stderr and "pool.size=0 (at least 1)" in done.stderr
    assert "Traceback" not in done.stderr and not store.exists()


def test_a_run_that_leaves_episodes_unscored_says_why_and_exits_non_zero(tmp_path: Path) -> None:
    """Episodes whose infrastructure failed past their attempts make the run incomplete: exit 4, the
    commonest cause on stderr, and how to play them again; the results that did finish are written."""
    suite = tmp_path / "suite"
    shutil.copytree(REPO / "benchmarks" / "tasks" / "trivial", suite / "trivial")
    shutil.copytree(REPO / "benchmarks" / "tasks" / "trivial", suite / "broken")
    (suite / "broken" / "environment" / "setup.sh").write_text("#!/bin/sh\necho the mirror is down >&2\nexit 1\n")
    store, out = tmp_path / "store", tmp_path / "run"
    done = run_benchmark("suite=dir", f"suite.path={suite}", "progress=false", "benchmark.plots=false",
                         f"backend.store_dir={store}", f"hydra.run.dir={out}")  # fmt: skip
    assert done.returncode == 4, done.stderr[-3000:]
    assert "run incomplete: 1 episode(s) ended unscored by infrastructure failures" in done.stderr
    assert "the mirror is down" in done.stderr and "resume=" in done.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["counts"]["infra_error"] == 1 and summary["by_task"]["trivial"]["mean_reward"] == 1.0
    assert any("the mirror is down" in cause for cause in summary["infra_causes"])


def test_run_benchmark_from_python_checks_and_runs_as_the_command_line(tmp_path: Path, shared_store: Path) -> None:
    with pytest.raises(ConfigError, match="did you mean size"):
        benchmarks.run_benchmark("pool.siz=2")
    outcome = benchmarks.run_benchmark(
        "agent=noop", "suite.include=[log-error-count]", "progress=false", "benchmark.plots=false",
        f"backend.store_dir={shared_store}", f"output_dir={tmp_path / 'run'}",
    )  # fmt: skip
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["mean_reward"] == 0.0 and summary["counts"]["finished"] == 1
    assert "mean reward 0.000" in outcome.table()


def test_help_lists_what_a_user_can_pick_and_the_config(tmp_path: Path) -> None:
    done = run_benchmark("--help", "backend=docker")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "agent: claude-code, codex, installed, llm, noop, oracle, python, replay" in done.stdout
    assert "pool: direct, ray" in done.stdout
    assert "_schema" not in done.stdout
    assert "shared_verification" in done.stdout  # the composed config, with the backend chosen


def test_an_invalid_task_directory_is_skipped_in_a_whole_suite_and_an_error_when_named(tmp_path: Path) -> None:
    suite = tmp_path / "suite"
    shutil.copytree(REPO / "benchmarks" / "tasks" / "trivial", suite / "trivial")
    shutil.copytree(REPO / "benchmarks" / "tasks" / "trivial", suite / "bad")
    (suite / "bad" / "task.toml").write_text("this is [not toml\n")
    store, out = tmp_path / "store", tmp_path / "run"
    done = run_benchmark("suite=dir", f"suite.path={suite}", "progress=false", "benchmark.plots=false",
                         f"backend.store_dir={store}", f"hydra.run.dir={out}")  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["by_task"]) == {"trivial"}
    assert "task.toml is not valid TOML" in summary["skipped_tasks"]["bad"]
    named = run_benchmark("suite=dir", f"suite.path={suite}", "suite.include=[bad]", f"backend.store_dir={store}",
                          f"hydra.run.dir={tmp_path / 'named'}")  # fmt: skip
    assert named.returncode == 2 and "task.toml is not valid TOML" in named.stderr


def test_a_task_whose_host_packages_are_missing_is_skipped_not_fatal(tmp_path: Path) -> None:
    """A suite where one task needs an apt package this host lacks runs the rest and says what to install;
    naming that task explicitly is an error that says the same."""
    suite = tmp_path / "suite"
    shutil.copytree(REPO / "benchmarks" / "tasks" / "trivial", suite / "trivial")
    needy = suite / "needs-package"
    shutil.copytree(REPO / "benchmarks" / "tasks" / "trivial", needy)
    (needy / "environment" / "setup.sh").unlink()
    (needy / "environment" / "Dockerfile").write_text(
        "FROM snapgym/host\nRUN apt-get update && apt-get install -y snapgym-no-such-package\nWORKDIR /app\n"
    )
    store, out = tmp_path / "store", tmp_path / "run"
    done = run_benchmark("suite=dir", f"suite.path={suite}", "progress=false", f"backend.store_dir={store}",
                         f"hydra.run.dir={out}")  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["by_task"]) == {"trivial"}
    assert summary["skipped_tasks"] == {"needs-package": "needs apt-get install snapgym-no-such-package"}
    assert "skipped needs-package" in done.stdout

    named = run_benchmark("suite=dir", f"suite.path={suite}", "suite.include=[needs-package]",
                          f"backend.store_dir={store}", f"hydra.run.dir={tmp_path / 'named'}")  # fmt: skip
    assert named.returncode == 2
    assert "apt-get install snapgym-no-such-package" in named.stderr


def test_durable_resumes_a_killed_runner_from_its_checkpoint_and_from_the_start(
    tmp_path: Path, shared_store: Path
) -> None:
    """Two real runners killed with SIGKILL at step 5: one goes on from step 4, the other plays all again."""
    out = tmp_path / "run"
    done = run_benchmark(
        "benchmark=durable",
        "benchmark.steps=8",
        "benchmark.checkpoint_every=2",
        "benchmark.killed_at=5",
        "benchmark.step_s=0.1",
        "benchmark.repetitions=1",
        f"backend.store_dir={shared_store}",
        f"hydra.run.dir={out}",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert {name: entry["n"] for name, entry in summary["methods"].items()} == {
        "recover_from_checkpoint": 1, "recover_from_start": 1,
    }  # fmt: skip
    meta = summary["meta"]
    assert (meta["recover_from_checkpoint_resumed_from_step"], meta["recover_from_checkpoint_steps_replayed"]) == (
        [4], [0],
    )  # fmt: skip
    assert meta["recover_from_start_resumed_from_step"] == [None]
    assert meta["recover_from_start_steps_replayed"][0] >= 5
    assert meta["checkpoint_ms"] > 0 and summary["ratios"]["from_start_vs_from_checkpoint"] > 0


def test_durable_refuses_a_kill_after_the_episode_ended(tmp_path: Path) -> None:
    done = run_benchmark("benchmark=durable", "benchmark.steps=8", "benchmark.killed_at=8",
                         "benchmark.checkpoint_every=2", f"hydra.run.dir={tmp_path}")  # fmt: skip
    assert done.returncode == 2
    assert "checkpoint_every <= benchmark.killed_at < benchmark.steps" in done.stderr


def test_durable_names_the_error_of_a_runner_it_started(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its runners get the run's backend; one that cannot start says why in the scenario's one-line error."""
    monkeypatch.delenv("E2B_API_KEY", raising=False)
    done = run_benchmark("benchmark=durable", "backend=e2b", "benchmark.steps=4", "benchmark.killed_at=2",
                         "benchmark.checkpoint_every=1", f"hydra.run.dir={tmp_path}")  # fmt: skip
    assert done.returncode == 2, done.stderr[-2000:]
    assert "RunnerFailedError: the runner ended before step 2 was journalled" in done.stderr
    assert "E2B_API_KEY is not set" in done.stderr and "Traceback" not in done.stderr


def test_a_baseline_episode_that_does_not_score_says_why(tmp_path: Path) -> None:
    """The throughput scenario's no-isolation baseline must do the same work: an episode of it that
    scores nothing stops it with the verifier's output, not a bare AssertionError."""
    from benchmarks.scenarios.baselines.noisolation import BaselineFailedError, episodes_per_s

    task = tmp_path / "task"
    (task / "tests").mkdir(parents=True)
    (task / "tests" / "test.sh").write_text("echo 'the answer is missing' >&2\nexit 1\n")
    with pytest.raises(BaselineFailedError, match="the answer is missing"):
        episodes_per_s(task, ["true"], episodes=2, concurrency=2, scratch=tmp_path)


def test_a_sweep_survives_a_failing_job_and_names_it(tmp_path: Path, shared_store: Path) -> None:
    """One job of a sweep fails on bad input: the other still runs, the combined table has both (the failed
    one with its error line), and the sweep exits with the failed job's status, naming it on one line."""
    sweep = tmp_path / "sweep"
    done = run_benchmark(
        "suite.include=[log-error-count],[no-such-task]",
        "progress=false",
        "benchmark.plots=false",
        f"backend.store_dir={shared_store}",
        f"hydra.sweep.dir={sweep}",
        multirun=True,
    )
    assert done.returncode == 2, done.stderr[-3000:]
    assert (sweep / "0" / "summary.json").is_file() and not (sweep / "1" / "summary.json").exists()
    failed = json.loads((sweep / "1" / "job_failed.json").read_text())
    assert failed["exit"] == 2 and "no-such-task" in failed["error"]
    combined = pd.read_csv(sweep / "combined.csv")
    assert list(combined["job"]) == [0, 1] and combined["failed"].isna().tolist() == [True, False]
    assert combined.loc[0, "mean_reward"] == 1.0
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("snapgym: 1 job(s) of the sweep failed: job 1 (exit 2): TaskNotFoundError:"), last
