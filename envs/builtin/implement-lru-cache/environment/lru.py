"""A fixed-capacity least-recently-used (LRU) cache."""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any


class LRUCache:
    """Map keys to values, holding at most ``capacity`` entries.

    When a ``put`` of a new key would exceed the capacity, the least recently used entry is
    evicted first. Both ``get`` (of a present key) and ``put`` count as a use of that key.
    """

    def __init__(self, capacity: int) -> None:
        """Create an empty cache. Raises ValueError unless ``capacity`` is a positive int."""
        raise NotImplementedError

    @property
    def capacity(self) -> int:
        """The maximum number of entries (read-only)."""
        raise NotImplementedError

    def get(self, key: Hashable, default: Any = None) -> Any:
        """The value stored for ``key`` (marking it most recently used), or ``default``."""
        raise NotImplementedError

    def put(self, key: Hashable, value: Any) -> None:
        """Store ``value`` for ``key`` and mark it most recently used, evicting if needed."""
        raise NotImplementedError

    def __len__(self) -> int:
        """The number of entries currently held."""
        raise NotImplementedError

    def __contains__(self, key: object) -> bool:
        """Whether ``key`` is held. Does not count as a use."""
        raise NotImplementedError

    def keys(self) -> list[Hashable]:
        """The held keys, from least to most recently used. Does not count as a use."""
        raise NotImplementedError
