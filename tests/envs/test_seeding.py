"""A seeded reset gives the generator Gymnasium would, though it is built only when first used."""

from __future__ import annotations

import gymnasium
import numpy as np
import pytest
from gymnasium.utils import seeding

from envs.episode.seeding import LazilySeeded


class _Env(LazilySeeded, gymnasium.Env[int, int]):
    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[int, dict]:
        self.seed_lazily(seed)
        return 0, {}


def test_the_numbers_after_a_seeded_reset_are_gymnasiums() -> None:
    env = _Env()
    env.reset(seed=1234)
    assert env._generator is None  # not built at reset
    expected, _ = seeding.np_random(1234)
    assert env.np_random.integers(0, 1 << 30, size=8).tolist() == expected.integers(0, 1 << 30, size=8).tolist()
    assert env.np_random_seed == 1234


def test_a_reset_without_a_seed_keeps_the_generator_going() -> None:
    env = _Env()
    env.reset(seed=7)
    first = env.np_random.integers(0, 1 << 30, size=4).tolist()
    env.reset()
    second = env.np_random.integers(0, 1 << 30, size=4).tolist()
    expected, _ = seeding.np_random(7)
    assert first + second == expected.integers(0, 1 << 30, size=8).tolist()


def test_reseeding_starts_the_sequence_again() -> None:
    env = _Env()
    env.reset(seed=3)
    first = env.np_random.random()
    env.reset(seed=3)
    assert env.np_random.random() == first


def test_a_bad_seed_gets_gymnasiums_error() -> None:
    env = _Env()
    with pytest.raises(gymnasium.error.Error, match="greater or equal"):
        env.reset(seed=-1)
    with pytest.raises(gymnasium.error.Error, match="python integer"):
        env.reset(seed="7")  # type: ignore[arg-type]


def test_a_generator_set_by_hand_is_used_and_has_no_known_seed() -> None:
    env = _Env()
    env.np_random = np.random.default_rng(5)
    assert env.np_random.random() == np.random.default_rng(5).random()
    assert env.np_random_seed == -1


def test_an_unseeded_env_still_gets_a_generator() -> None:
    env = _Env()
    assert isinstance(env.np_random, np.random.Generator)
    assert env.np_random_seed >= 0
