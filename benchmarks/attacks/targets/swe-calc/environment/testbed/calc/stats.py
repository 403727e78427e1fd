"""Sums and means."""


def total(values):
    """The sum of ``values``."""
    result = 0.0
    for value in values:
        result += value
    return result


def mean(values):
    """The arithmetic mean of ``values``."""
    values = list(values)
    return total(values) / len(values)
