"""An environment's random generator, made when first used rather than at every seeded reset.

Gymnasium's ``Env.reset(seed=...)`` builds the generator at once (a ``SeedSequence`` and a
``PCG64``: about 0.2 ms). A runner that seeds every episode pays that each time, while a
snapgym environment draws from ``np_random`` only to pick the next task of a task set. Here the
seed is kept and the generator built from it on first use, through any of Gymnasium's ways to
reach it (``np_random``, ``np_random_seed``, the ``_np_random`` its env checker reads): the same
numbers as Gymnasium's, and the same seed.
"""

from __future__ import annotations

import numpy as np
from gymnasium.utils import seeding


class LazilySeeded:
    """Mixin for a ``gymnasium.Env``: :meth:`seed_lazily` in ``reset`` instead of ``super().reset(seed=...)``."""

    _generator: np.random.Generator | None = None
    _np_random_seed: int | None

    def seed_lazily(self, seed: int | None) -> None:
        """Reseed with ``seed`` (None: keep the current generator), as ``gymnasium.Env.reset`` does.

        Raises:
            gymnasium.error.Error: ``seed`` is not a non-negative int (Gymnasium's own check).
        """
        if seed is None:
            return
        if not isinstance(seed, int) or seed < 0:
            seeding.np_random(seed)  # raises Gymnasium's error for it
        self._generator = None
        self._np_random_seed = seed

    @property
    def _np_random(self) -> np.random.Generator | None:
        """Gymnasium's slot for the generator: built here from a seed given and not yet used."""
        if self._generator is None and self._np_random_seed is not None and self._np_random_seed >= 0:
            self._generator, self._np_random_seed = seeding.np_random(self._np_random_seed)
        return self._generator

    @_np_random.setter
    def _np_random(self, value: np.random.Generator | None) -> None:
        self._generator = value
