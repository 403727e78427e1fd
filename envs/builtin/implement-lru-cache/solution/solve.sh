#!/bin/bash
cat > /app/lru.py <<'PY'
"""A fixed-capacity least-recently-used (LRU) cache."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from typing import Any


class LRUCache:
    """Map keys to values, holding at most ``capacity`` entries.

    When a ``put`` of a new key would exceed the capacity, the least recently used entry is
    evicted first. Both ``get`` (of a present key) and ``put`` count as a use of that key.
    """

    def __init__(self, capacity: int) -> None:
        """Create an empty cache. Raises ValueError unless ``capacity`` is a positive int."""
        if not isinstance(capacity, int) or isinstance(capacity, bool) or capacity <= 0:
            raise ValueError(f"capacity must be a positive int, not {capacity!r}")
        self._capacity = capacity
        self._data: OrderedDict[Hashable, Any] = OrderedDict()

    @property
    def capacity(self) -> int:
        """The maximum number of entries (read-only)."""
        return self._capacity

    def get(self, key: Hashable, default: Any = None) -> Any:
        """The value stored for ``key`` (marking it most recently used), or ``default``."""
        if key not in self._data:
            return default
        self._data.move_to_end(key)
        return self._data[key]

    def put(self, key: Hashable, value: Any) -> None:
        """Store ``value`` for ``key`` and mark it most recently used, evicting if needed."""
        if key in self._data:
            self._data.move_to_end(key)
        elif len(self._data) >= self._capacity:
            self._data.popitem(last=False)
        self._data[key] = value

    def __len__(self) -> int:
        """The number of entries currently held."""
        return len(self._data)

    def __contains__(self, key: object) -> bool:
        """Whether ``key`` is held. Does not count as a use."""
        return key in self._data

    def keys(self) -> list[Hashable]:
        """The held keys, from least to most recently used. Does not count as a use."""
        return list(self._data)
PY
