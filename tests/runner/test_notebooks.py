"""The notebooks run top to bottom in a real Jupyter kernel, and are committed without outputs."""

from __future__ import annotations

import os
import re
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

REPO = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))
SHOWS_PLOTS = {"02_evaluate_and_analyze.ipynb", "03_train_a_policy.ipynb"}
"""Notebooks that must display at least one figure inline."""
LEARNING_CURVE = re.compile(r"mean reward: first 3 iterations ([0-9.]+), last 3 ([0-9.]+)")
"""What 03_train_a_policy.ipynb prints after training."""


def test_every_notebook_is_collected() -> None:
    """A renamed or moved notebook would otherwise drop out of the tests silently."""
    expected = {"01_quickstart.ipynb", "02_evaluate_and_analyze.ipynb", "03_train_a_policy.ipynb"}
    assert expected <= {p.name for p in NOTEBOOKS}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs_top_to_bottom(path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every cell executes without error in a fresh python3 kernel, working in a temporary folder."""
    monkeypatch.setenv("SNAPGYM_STORE", str(tmp_path / "store"))
    # The kernel imports this checkout's packages, whatever (if anything) is installed in site-packages.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    notebook = nbformat.read(path, as_version=4)
    client = NotebookClient(notebook, timeout=300, kernel_name="python3", resources={"metadata": {"path": tmp_path}})
    client.execute(env=dict(os.environ))
    outputs = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.outputs]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    if path.name in SHOWS_PLOTS:
        assert any("image/png" in o.get("data", {}) for o in outputs), f"{path.name} showed no figure inline"
    if path.name == "03_train_a_policy.ipynb":  # the notebook asserts it too; this keeps that check from going away
        printed = "".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream")
        curve = LEARNING_CURVE.search(printed)
        assert curve, "03_train_a_policy.ipynb printed no learning curve"
        assert float(curve[2]) > float(curve[1]) + 0.3, curve[0]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_is_committed_without_outputs(path: Path) -> None:
    """Outputs and execution counts are stripped, so diffs stay readable."""
    notebook = nbformat.read(path, as_version=4)
    for cell in notebook.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, f"{path.name} has outputs; clear them"
