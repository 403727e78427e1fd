"""Scenarios of the asynchronous API (``benchmark=aio``: :mod:`benchmarks.scenarios.aio.inflight`)."""
