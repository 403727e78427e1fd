"""How a resume finds its run (the newest unfinished one) and what it says about values it ignores."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from benchmarks.episodes.recording import rundir
from pool.errors import ConfigError


def make_run(root: Path, name: str, *, summary: dict[str, object] | None, mtime: float) -> Path:
    run = root / name
    run.mkdir(parents=True)
    (run / rundir.RUN_CONFIG).write_text("benchmark:\n  name: eval\nmax_steps: 5\nsuite:\n  name: builtin\n")
    (run / "ledger.jsonl").write_text("")
    os.utime(run / "ledger.jsonl", (mtime, mtime))
    if summary is not None:
        (run / "summary.json").write_text(json.dumps(summary))
    return run


def counts(finished: int, scheduled: int = 3, infra_error: int = 0) -> dict[str, object]:
    return {"counts": {"finished": finished, "scheduled": scheduled, "infra_error": infra_error}}


def test_resume_true_picks_the_newest_unfinished_run_not_a_finished_one(tmp_path: Path) -> None:
    make_run(tmp_path, "old-interrupted", summary=None, mtime=1_000)
    unscored = make_run(tmp_path, "mid-unscored", summary=counts(3, infra_error=1), mtime=2_000)
    make_run(tmp_path, "newest-complete", summary=counts(3), mtime=3_000)
    assert rundir.latest_run("eval", tmp_path) == unscored
    stopped = make_run(tmp_path, "stopped", summary={**counts(1), "stopped": "OutageError"}, mtime=4_000)
    assert rundir.latest_run("eval", tmp_path) == stopped


def test_with_only_finished_runs_resume_true_says_there_is_nothing_to_resume(tmp_path: Path) -> None:
    make_run(tmp_path, "done", summary=counts(3), mtime=1_000)
    with pytest.raises(ConfigError, match=r"no unfinished eval run .*1 finished ones; nothing to resume"):
        rundir.latest_run("eval", tmp_path)


def test_a_resume_names_only_the_plan_values_given_now_that_it_ignores(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    run = make_run(tmp_path, "run", summary=None, mtime=1_000)
    current = OmegaConf.create({"resume": str(run), "output_dir": None, "benchmark": {"name": "eval"},
                                "max_steps": 50, "suite": {"name": "other"}})  # fmt: skip
    with caplog.at_level(logging.WARNING):
        _, merged, resumed = rundir.resolve(current, tmp_path / "hydra", given={"resume"})
    assert resumed and merged.max_steps == 5 and merged.suite.name == "builtin"
    assert "ignored" not in caplog.text  # the defaults differ, but nothing was given
    with caplog.at_level(logging.WARNING):
        rundir.resolve(current, tmp_path / "hydra", given={"resume", "max_steps"})
    assert "saved run's max_steps (different values given now were ignored)" in caplog.text


def test_a_ray_job_writes_its_run_outside_rays_copy_of_the_code(tmp_path: Path) -> None:
    """``ray job submit --working-dir .`` runs in a copy Ray deletes with the job: the run goes home."""
    package = tmp_path / "ray/session_1/runtime_resources/working_dir_files/_ray_pkg_0123"
    hydra_dir = package / "outputs/2026-12-02/10-00-00-eval"
    assert rundir._outside_ray_package(hydra_dir, tmp_path / "home") == (
        tmp_path / "home/snapgym-outputs/2026-12-02/10-00-00-eval"
    )
    assert rundir._outside_ray_package(Path("outputs/2026-12-02/x")) == Path("outputs/2026-12-02/x")
