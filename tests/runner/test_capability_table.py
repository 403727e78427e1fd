"""The documentation's backend-by-feature table is what the backends declare now, the declarations
cover what a backend does on this machine, and the table's installed-agents row agrees with the
runner's refusal (pool.backends.features)."""

from __future__ import annotations

import difflib
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from benchmarks.job import Job
from pool import load_backend
from pool.backends import BACKENDS, has_model_gateway, option_defaults
from pool.backends.features import BEGIN, COMMAND, END, FEATURES, declared_range, feature_table, splice
from pool.errors import ConfigError
from tests.support.backends import backend_params
from tests.support.needs import skip_missing

PAGE = Path(__file__).resolve().parents[2] / "docs/backends/capabilities.md"
ISSUE_29_FEATURES = (
    "task images", "resources", "storage quota", "verification modes", "egress control", "egress audit",
    "end-state changes", "fork", "memory snapshots", "GPUs", "installed agents",
)  # fmt: skip


def rendered() -> str:
    """The table as the generator renders it now (skipped where a provider's SDK is not installed)."""
    try:
        return feature_table()
    except ConfigError as exc:
        if "not installed" not in str(exc):
            raise
        skip_missing(f"the table needs every backend's SDK: {exc}")


def test_the_documented_table_is_what_the_backends_declare_now() -> None:
    committed = PAGE.read_text()
    expected = splice(committed, rendered())
    if committed != expected:
        diff = "".join(difflib.unified_diff(committed.splitlines(True), expected.splitlines(True), "committed", "now"))
        pytest.fail(
            f"{PAGE.name} differs from what the backends declare; regenerate it with\n\n    {COMMAND}\n\n{diff}"
        )


def test_the_table_has_a_row_for_each_feature_and_a_column_for_each_backend() -> None:
    table = rendered()
    assert [feature.name for feature in FEATURES] == list(ISSUE_29_FEATURES)
    header = table.splitlines()[0]
    assert all(f"`{name}`" in header for name in BACKENDS)
    for feature in FEATURES:
        assert sum(line.startswith(f"| {feature.name} |") for line in table.splitlines()) == 1


def test_splicing_keeps_the_page_around_the_markers_and_refuses_a_page_without_them() -> None:
    page = f"intro\n{BEGIN}\nold table\n{END}\noutro\n"
    spliced = splice(page, "| new |\n")
    assert spliced == f"intro\n{BEGIN}\n\n| new |\n\n{END}\noutro\n"
    assert splice(spliced, "| new |\n") == spliced
    with pytest.raises(ConfigError, match="markers"):
        splice("no markers here", "| new |\n")


@pytest.mark.parametrize("name", backend_params(("local", "docker")))
def test_the_declared_range_covers_what_the_backend_does_on_this_machine(name: str) -> None:
    """Every cell this machine's backend gives is among the values its class declares."""
    declared = declared_range(name)
    backend = load_backend(name)
    try:
        here = backend.capabilities
    finally:
        backend.close()
    for feature in FEATURES:
        possible = {feature.cell(name, capabilities) for capabilities in declared.values()}
        assert feature.cell(name, here) in possible, (feature.name, possible)


@pytest.mark.parametrize("name", list(BACKENDS))
def test_the_installed_agents_row_agrees_with_the_runner(name: str, tmp_path: Path) -> None:
    """The runner refuses an installed agent exactly where the table's typical cell says "no"."""
    try:
        typical = next(iter(declared_range(name).values()))
    except ConfigError as exc:
        skip_missing(str(exc))
    installed = next(feature for feature in FEATURES if feature.name == "installed agents")
    route = {"name": "anthropic", "api": "anthropic", "upstream": "https://api.anthropic.com"}
    config = OmegaConf.create(
        {"backend": {"name": name, **option_defaults(name)}, "agent": {"kind": "installed", "model_route": route}}
    )
    job = Job(config=config, output_dir=tmp_path)
    if installed.cell(name, typical) == "yes":
        assert job.backend_options()["egress"]["models"][-1]["name"] == "anthropic"
    else:
        assert not has_model_gateway(name)
        with pytest.raises(ConfigError, match="model gateway"):
            job.backend_options()
