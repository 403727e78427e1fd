"""snapgym benchmarks: a Hydra runner and one module per scenario.

Run ``python -m benchmarks.run benchmark=reset_latency``; results land in
Hydra's run directory (``summary.json``, ``samples.csv``). From Python,
``benchmarks.run_benchmark("agent=noop", ...)`` does the same and returns the outcome.
"""

from benchmarks.api import run_benchmark

__all__ = ["run_benchmark"]
