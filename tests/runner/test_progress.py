"""The run's progress bar: the figures it shows are the results counted, however seldom it redraws."""

from __future__ import annotations

import pytest

from benchmarks.episodes.attempt import AGENT_ERROR, INFRA_ERROR, SCORED
from benchmarks.reports.progress import Progress


def test_the_bar_ends_with_the_mean_reward_of_the_scored_results(capsys: pytest.CaptureFixture[str]) -> None:
    progress = Progress(total=5, done=0, enabled=True, description="run")
    results = [(SCORED, 1.0), (SCORED, 0.0), (INFRA_ERROR, None), (AGENT_ERROR, None), (SCORED, 0.5)]
    for outcome, reward in results:
        progress.update({"outcome": outcome, "reward": reward})
    # an infra error is no verdict on the agent; an agent error scores 0
    assert progress.mean_reward == pytest.approx(1.5 / 4)
    progress.close()
    shown = capsys.readouterr().err
    assert "reward=0.375" in shown and "infra=1" in shown and "5/5" in shown


def test_a_disabled_bar_still_counts() -> None:
    progress = Progress(total=2, done=0, enabled=False, description="run")
    progress.update({"outcome": SCORED, "reward": 1.0})
    progress.update({"outcome": SCORED, "reward": 0.0})
    assert progress.mean_reward == 0.5
    progress.close()
