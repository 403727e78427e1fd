"""snapgym benchmarks: a Hydra runner and one module per scenario.

Run ``python -m benchmarks.run benchmark=reset_latency``; results land in
Hydra's run directory (``summary.json``, ``samples.csv``).
"""
