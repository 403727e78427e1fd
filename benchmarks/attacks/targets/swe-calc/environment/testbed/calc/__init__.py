"""A small statistics library."""

from calc.stats import mean, total

__all__ = ["mean", "total"]
