"""Run a benchmark scenario from Python (a notebook, a script, a Ray task) exactly as the command line does."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

from omegaconf import DictConfig

from benchmarks.cli import check_choices, check_nested_keys, compose_config, config_overrides
from benchmarks.config import (
    check_backend_options,
    check_pool_installed,
    register_configs,
    reject_unknown_keys,
    require_values,
)
from benchmarks.job import Job, Outcome
from benchmarks.paths import expand_config_paths, quote_path_arguments


def run_benchmark(*overrides: str) -> Outcome:
    """What ``python -m benchmarks.run OVERRIDES`` does, returning the scenario's outcome.

    The same config (``configs/`` composed with ``overrides``), the same checks before any work
    (unknown keys named with the closest valid ones, missing values, backend options), the same
    files in the run directory (``output_dir=...``, else ``outputs/<date>/<time>-<benchmark>``).
    The outcome prints as the command line's table (``.table()``); an eval's has ``.summary``
    (summary.json) and ``.run_dir``.

    Raises:
        ConfigError: bad input, named.
        ScenarioStoppedError: the run stopped early (an outage, or Ctrl-C: ``.interrupted``), with what
            finished written and ``.run_dir`` to resume.
    """
    from benchmarks.run import load_scenario

    given = quote_path_arguments(config_overrides(overrides))
    config = checked_config(given)
    check_backend_options(config)
    check_pool_installed(config)
    name = str(config.benchmark.name)
    scenario = load_scenario(name)
    output_dir = Path(config.output_dir) if config.output_dir else _default_output_dir(name)
    job = Job(config, output_dir, tuple(given))
    try:
        outcome = scenario(job)
    finally:
        job.close()
    outcome.write(output_dir)
    return outcome


def checked_config(overrides: Sequence[str]) -> DictConfig:
    """The run's config from ``configs/`` and ``overrides``, after the command line's own checks: unknown
    keys (top-level and nested, named with the closest valid ones), unknown choices of a group and missing
    values; ``~`` and relative paths made absolute (see ``benchmarks.paths``).

    Raises:
        ConfigError: the first problem, named.
    """
    from benchmarks.run import check_top_level_keys  # the command line's own check

    register_configs()
    overrides = quote_path_arguments(overrides)
    check_top_level_keys(list(overrides))
    check_choices(overrides)
    check_nested_keys(overrides)
    config = compose_config(overrides)
    reject_unknown_keys(config)
    require_values(config)
    expand_config_paths(config)
    return config


def _default_output_dir(name: str) -> Path:
    return Path("outputs") / time.strftime("%Y-%m-%d") / f"{time.strftime('%H-%M-%S')}-{name}"
