"""Backends behind the sandbox contract.

Each backend lives in its own module and is imported lazily, so a missing
provider SDK only matters when that backend is asked for.
"""

from __future__ import annotations

import importlib
from typing import Any

from pool.errors import ConfigError

# name -> ("module:attribute", pip extra that brings its SDK, or None)
BACKENDS: dict[str, tuple[str, str | None]] = {
    "local": ("pool.backends.local:LocalBackend", None),
}


def load_backend(name: str, **options: Any) -> Any:
    """Construct a backend by name, e.g. ``load_backend("local", memory_limit_mb=512)``."""
    try:
        target, extra = BACKENDS[name]
    except KeyError:
        raise ConfigError(f"unknown backend {name!r}; choose one of: {', '.join(sorted(BACKENDS))}") from None
    module_name, attr = target.split(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        hint = f"pip install 'snapgym[{extra}]'" if extra else "reinstall snapgym"
        raise ConfigError(f"backend {name!r} needs a package that is not installed ({exc}); {hint}") from exc
    return getattr(module, attr)(**options)
