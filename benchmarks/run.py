"""Benchmark runner: ``python -m benchmarks.run benchmark=<scenario> backend=<backend>``.

Hydra composes ``configs/config.yaml`` against the schemas in
``benchmarks.config``, so a mistyped key or a wrong type stops the run before
any sandbox starts. The chosen scenario runs against the chosen backend; its
``summary.json`` and ``samples.csv`` go to Hydra's run directory and a table
is printed.

Examples:
    python -m benchmarks.run
    python -m benchmarks.run benchmark.repetitions.restore=1000 backend.store_dir=/tmp/store
    python -m benchmarks.run hydra.run.dir=results/reset
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from benchmarks import report
from benchmarks.config import register_configs, reject_unknown_keys
from pool import Backend, ConfigError, load_backend

# benchmark.name -> module whose ``run(cfg, backend) -> Report`` measures it; imported lazily.
SCENARIOS: dict[str, str] = {
    "reset_latency": "benchmarks.scenarios.reset_latency",
    "pool": "benchmarks.scenarios.pool",
}

Scenario = Callable[[Any, Backend], report.Report]

log = logging.getLogger(__name__)


def load_scenario(name: str) -> Scenario:
    """The ``run`` function of a scenario by name.

    Raises:
        ConfigError: no scenario has that name.
    """
    try:
        module_name = SCENARIOS[name]
    except KeyError:
        raise ConfigError(f"unknown benchmark {name!r}; choose one of: {', '.join(sorted(SCENARIOS))}") from None
    return cast(Scenario, importlib.import_module(module_name).run)


def open_backend(cfg: DictConfig) -> Backend:
    """Construct the backend named by ``cfg.name`` with the other keys as keywords."""
    options = cast(dict[str, Any], OmegaConf.to_container(cfg, resolve=True))
    return cast(Backend, load_backend(options.pop("name"), **options))


@hydra.main(config_path="../configs", config_name="config", version_base="1.3")
def _run(cfg: DictConfig) -> None:
    reject_unknown_keys(cfg)
    scenario = load_scenario(cfg.benchmark.name)
    settings = OmegaConf.to_object(cfg.benchmark)
    output_dir = Path(HydraConfig.get().runtime.output_dir)
    backend = open_backend(cfg.backend)
    try:
        log.info("running %s on the %s backend", cfg.benchmark.name, backend.name)
        outcome = scenario(settings, backend)
    finally:
        backend.close()
    summary_path = report.write(outcome, output_dir)
    print(report.format_table(outcome))
    print(f"\nsummary: {summary_path}")


def main() -> None:
    """Register the config schemas, then hand the command line to Hydra."""
    register_configs()
    _run()


if __name__ == "__main__":
    main()
