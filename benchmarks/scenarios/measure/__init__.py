"""Measuring kit of the scenarios: timing loops, CPU clocks, a minimal rootfs, the benchmark
workspace and a throwaway TLS origin."""
