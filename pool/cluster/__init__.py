"""The Ray pool: host actors that own warm sandboxes, the manager that hands out leases, and the
pool's config and metrics. Ray is imported only here (and lazily): it is the ``ray`` extra
(``pip install 'snapgym[ray]'``), not part of the base install."""

from __future__ import annotations

import importlib

from pool.errors import ConfigError

RAY_INSTALL_HINT = "pip install 'snapgym[ray]'"
"""What brings Ray (``ray[default]``, with the dashboard that ``ray job submit`` talks to)."""


def require_ray() -> None:
    """Import Ray, or say in one line how to install it.

    Raises:
        ConfigError: Ray is not installed (or one of its own dependencies is missing or broken).
    """
    try:
        importlib.import_module("ray")
    except ImportError as exc:
        if isinstance(exc, ModuleNotFoundError) and exc.name == "ray":
            raise ConfigError(f"pool=ray needs Ray: {RAY_INSTALL_HINT}") from None
        raise ConfigError(f"pool=ray needs Ray, which did not import ({exc}): {RAY_INSTALL_HINT}") from exc
