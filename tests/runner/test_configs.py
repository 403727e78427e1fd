"""The YAML files of ``configs/`` restate no default of their schema: each default has one home, the
dataclass that Hydra's ConfigStore holds, and a YAML sets only what differs from it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from benchmarks.config import register_configs

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
GROUPS = ("agent", "benchmark", "pool", "suite")
"""The groups whose YAMLs start from a schema (backend's start from the constructors' options)."""
NOT_SETTINGS = ("defaults", "hydra")


def _group_files() -> list[Path]:
    return [CONFIGS / "config.yaml", *sorted(path for group in GROUPS for path in (CONFIGS / group).glob("*.yaml"))]


def _schema_defaults(path: Path, document: dict[str, Any]) -> dict[str, Any]:
    group = "" if path.parent == CONFIGS else f"{path.parent.name}/"
    node = ConfigStore.instance().load(f"{group}{document['defaults'][0]}.yaml").node
    defaults = OmegaConf.to_container(node, enum_to_str=True)
    assert isinstance(defaults, dict)
    return {str(key): value for key, value in defaults.items()}


@pytest.mark.parametrize("path", _group_files(), ids=lambda path: path.relative_to(CONFIGS).as_posix())
def test_a_configs_yaml_sets_only_what_differs_from_its_schema(path: Path) -> None:
    register_configs()
    document = yaml.safe_load(path.read_text())
    defaults = _schema_defaults(path, document)
    settings = {key: value for key, value in document.items() if key not in NOT_SETTINGS}
    assert set(settings) <= set(defaults)
    restated = sorted(key for key, value in settings.items() if value == defaults[key])
    assert not restated, f"{path.name} restates its schema's defaults of {restated}"
