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
import logging
from pathlib import Path

from omegaconf import DictConfig, ListConfig, OmegaConf

from benchmarks.ledger import LEDGER_FILE
from pool.errors import ConfigError

RUN_CONFIG = "run.yaml"
PLAN_KEYS = (
    "suite", "agent", "benchmark", "env", "verification", "episodes_per_task", "seed", "max_steps", "step_timeout_s",
    "episode_timeout_s", "max_attempts", "pass_at_k", "success_threshold",
)  # fmt: skip
"""Config keys a resume takes from the saved run."""
OUTPUTS = Path("outputs")

log = logging.getLogger(__name__)


def resolve(config: DictConfig, hydra_dir: Path) -> tuple[Path, DictConfig, bool]:
    """The run directory, the config to run with, and whether this resumes an earlier run.

    Raises:
        ConfigError: resume names a directory without a run, or no unfinished run is found.
    """
    resume = config.resume
    if resume in (False, None, "false", ""):
        run_dir = Path(config.output_dir) if config.output_dir else hydra_dir
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
    return run_dir, _merge_saved(config, OmegaConf.load(saved)), True


def latest_run(scenario: str, root: Path = OUTPUTS) -> Path:
    """The most recently written run directory of ``scenario`` under ``root``."""
    candidates = []
    for path in root.glob(f"**/{RUN_CONFIG}"):
        saved = OmegaConf.load(path)
        if isinstance(saved, DictConfig) and saved.get("benchmark", {}).get("name") == scenario:
            candidates.append(path.parent)
    if not candidates:
        raise ConfigError(f"resume=true found no {scenario} run under {root}/; give resume=<run directory>")
    return max(candidates, key=lambda p: (p / LEDGER_FILE).stat().st_mtime if (p / LEDGER_FILE).exists() else 0)


def _save(run_dir: Path, config: DictConfig) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / RUN_CONFIG).write_text(OmegaConf.to_yaml(config, resolve=True))


def _merge_saved(current: DictConfig, saved: DictConfig | object) -> DictConfig:
    if not isinstance(saved, DictConfig):
        raise ConfigError(f"the saved {RUN_CONFIG} is not a mapping")
    merged = current.copy()
    ignored = []
    for key in PLAN_KEYS:
        if key in saved:
            if _plain(current.get(key)) != _plain(saved[key]):
                ignored.append(key)
            merged[key] = saved[key]
    if ignored:
        log.warning("resuming with the saved run's %s (different values given now were ignored)", ", ".join(ignored))
    return merged


def _plain(value: object) -> object:
    if isinstance(value, DictConfig | ListConfig):
        return OmegaConf.to_container(value, resolve=True, enum_to_str=True)
    return value.name if isinstance(value, enum.Enum) else value
