"""Task material made from real sources: pinned sdists, SWE-bench-shaped tasks, TB2-shaped images."""
