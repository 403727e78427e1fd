"""The Daytona backend (``backend=daytona``, ``pip install 'snapgym[daytona]'``): see :mod:`.backend`."""

from pool.backends.daytona.backend import DaytonaBackend

__all__ = ["DaytonaBackend"]
