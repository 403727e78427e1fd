"""The E2B backend (``backend=e2b``, ``pip install 'snapgym[e2b]'``): see :mod:`pool.backends.e2b.backend`."""

from pool.backends.e2b.backend import E2BBackend

__all__ = ["E2BBackend"]
