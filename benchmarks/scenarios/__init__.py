"""Benchmark scenarios; each module exposes ``run(cfg, backend, output_dir) -> Report``."""
