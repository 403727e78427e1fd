"""A run's directory: where it goes, what it saved, and how a resume finds and checks it.

A new run writes ``run.yaml`` (its resolved config, which names the key's
environment variable but never holds a key) next to its ledger. Resuming
reads it back: the settings that define which episodes exist and how they are
played (suite, agent, env, episodes_per_task, seed, limits, benchmark) come
from the saved run, so the resumed run finishes the same plan. Only where and
how fast it runs (backend, pool, progress) may change.
"""

from __future__ import annotations

import enum
import json
import logging
from collections.abc import Collection
from pathlib import Path

from omegaconf import DictConfig, ListConfig, OmegaConf

from benchmarks.episodes.recording.ledger import LEDGER_FILE
from pool.errors import ConfigError

RUN_CONFIG = "run.yaml"
SUMMARY_FILE = "summary.json"
"""The run's summary, written last: a run folder that has it is finished."""
PLAN_KEYS = (
    "suite", "agent", "benchmark", "env", "verification", "episodes_per_task", "seed", "max_steps", "step_timeout_s",
    "episode_timeout_s", "max_attempts", "pass_at_k", "success_threshold", "checkpoint_every",
)  # fmt: skip
"""Config keys a resume takes from the saved run."""
OUTPUTS = Path("outputs")
RAY_PACKAGE_DIR = "working_dir_files"
"""The folder of Ray's runtime resources that holds a job's copy of its working directory."""

log = logging.getLogger(__name__)


def resolve(config: DictConfig, hydra_dir: Path, *, given: Collection[str] = ()) -> tuple[Path, DictConfig, bool]:
    """The run directory, the config to run with, and whether this resumes an earlier run.

    ``given``: the top-level keys given on the command line; a resume names those it ignores.

    Raises:
        ConfigError: resume names a directory without a run, or no unfinished run is found.
    """
    resume = config.resume
    if resume in (False, None, "false", ""):
        run_dir = Path(config.output_dir) if config.output_dir else _outside_ray_package(hydra_dir)
        if (run_dir / LEDGER_FILE).exists():
            raise ConfigError(
                f"{run_dir} already holds a run; resume it with resume=true output_dir={run_dir}, "
                "or pick a new output_dir"
            )
        _save(run_dir, config)
        return run_dir, config, False
    if resume is True or resume == "true":
        run_dir = Path(config.output_dir) if config.output_dir else latest_run(config.benchmark.name)
    else:
        run_dir = Path(str(resume))
    saved = run_dir / RUN_CONFIG
    if not saved.is_file():
        raise ConfigError(f"cannot resume {run_dir}: it has no {RUN_CONFIG} (is it a snapgym run directory?)")
    return run_dir, _merge_saved(config, OmegaConf.load(saved), given), True


def _outside_ray_package(hydra_dir: Path, home: Path | None = None) -> Path:
    """Hydra's run directory, unless it lies in the copy of the code Ray makes for a job (``ray job submit
    --working-dir``, deleted with the job's session): then the same relative path under ``~/snapgym-outputs``."""
    resolved = hydra_dir.resolve()
    if RAY_PACKAGE_DIR not in resolved.parts:
        return hydra_dir
    parts = resolved.parts
    package_root = parts.index(RAY_PACKAGE_DIR) + 2  # working_dir_files/_ray_pkg_<hash>/...
    moved = (home or Path.home()) / "snapgym-outputs" / Path(*parts[package_root + 1 :])
    log.warning("this run's directory would be inside Ray's copy of the code; writing it to %s instead", moved)
    return moved


def latest_run(scenario: str, root: Path = OUTPUTS) -> Path:
    """The most recently written run directory of ``scenario`` under ``root`` that is not finished (see
    :func:`is_finished`)."""
    candidates, finished = [], 0
    for path in root.glob(f"**/{RUN_CONFIG}"):
        saved = OmegaConf.load(path)
        if isinstance(saved, DictConfig) and saved.get("benchmark", {}).get("name") == scenario:
            if is_finished(path.parent):
                finished += 1
            else:
                candidates.append(path.parent)
    if not candidates:
        also = f" ({finished} finished ones; nothing to resume)" if finished else ""
        raise ConfigError(
            f"resume=true found no unfinished {scenario} run under {root}/{also}; give resume=<run directory>"
        )
    return max(candidates, key=lambda p: (p / LEDGER_FILE).stat().st_mtime if (p / LEDGER_FILE).exists() else 0)


def is_finished(run_dir: Path) -> bool:
    """True when the run's summary.json says every scheduled episode has a final, scored-or-agent's result
    (not stopped, nothing left unscored by the infrastructure)."""
    try:
        summary = json.loads((run_dir / SUMMARY_FILE).read_text())
        counts = summary["counts"]
        return (
            "stopped" not in summary
            and int(counts["finished"]) >= int(counts["scheduled"])
            and not int(counts.get("infra_error", 0))
        )
    except (OSError, ValueError, KeyError, TypeError):
        return False


def _save(run_dir: Path, config: DictConfig) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / RUN_CONFIG).write_text(OmegaConf.to_yaml(config, resolve=True))


def _merge_saved(current: DictConfig, saved: DictConfig | object, given: Collection[str]) -> DictConfig:
    if not isinstance(saved, DictConfig):
        raise ConfigError(f"the saved {RUN_CONFIG} is not a mapping")
    merged = current.copy()
    ignored = []
    for key in PLAN_KEYS:
        if key in saved:
            if key in given and _plain(current.get(key)) != _plain(saved[key]):
                ignored.append(key)
            merged[key] = saved[key]
    if ignored:
        log.warning("resuming with the saved run's %s (different values given now were ignored)", ", ".join(ignored))
    return merged


def _plain(value: object) -> object:
    if isinstance(value, DictConfig | ListConfig):
        return OmegaConf.to_container(value, resolve=True, enum_to_str=True)
    return value.name if isinstance(value, enum.Enum) else value
