"""The base install has no Ray (the ``ray`` extra brings it): ``pool=ray`` without Ray refuses in one line.

Ray is hidden honestly, in a subprocess whose import system cannot find it (a meta-path finder
ahead of the others raises ModuleNotFoundError for ``ray``), exactly as in an environment where it
was never installed; the runner itself runs unchanged. CI (.ci/run) also installs the base package
into a fresh venv and runs the same command there, with no Ray at all.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

WITHOUT_RAY = """
import runpy, sys

class NoRay:
    def find_spec(self, name, path=None, target=None):
        if name == "ray" or name.startswith("ray."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.modules.pop("ray", None)
sys.meta_path.insert(0, NoRay())
sys.argv = ["benchmarks.run", *sys.argv[1:]]
runpy.run_module("benchmarks.run", run_name="__main__", alter_sys=True)
"""


def _run_without_ray(*overrides: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    return subprocess.run(
        [sys.executable, "-c", WITHOUT_RAY, "progress=false", *overrides],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def test_pool_ray_without_ray_refuses_in_one_line_before_any_sandbox(tmp_path: Path) -> None:
    """``pool=ray`` where Ray is not installed: exit 2, one line naming the extra, and nothing run."""
    done = _run_without_ray("pool=ray", "suite.include=[jsonl-to-csv]", f"hydra.run.dir={tmp_path}")
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == ["snapgym: ConfigError: pool=ray needs Ray: pip install 'snapgym[ray]'"]
    assert not (tmp_path / "summary.json").exists()
    assert not [p for p in tmp_path.iterdir() if p.name != ".hydra" and p.suffix != ".log"]


def test_the_default_pool_runs_without_ray(tmp_path: Path) -> None:
    """The base install's main job (``pool=direct``) never imports Ray."""
    done = _run_without_ray("suite.include=[jsonl-to-csv]", "benchmark.plots=false", f"hydra.run.dir={tmp_path}")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "summary.json").exists()
