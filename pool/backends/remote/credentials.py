"""What signs a cloud backend in: :class:`Credentials`, read and checked the same way when the
backend is made and when :meth:`~pool.contract.Backend.unavailable_reason` asks whether it could be."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pool.errors import ConfigError


@dataclasses.dataclass(frozen=True, slots=True)
class Credentials:
    """A cloud backend's credential options, each read from an environment variable when not given.

    Every one must be set, unless a file the provider's SDK reads on its own is there (Modal's
    ``~/.modal.toml``). They never enter a sandbox, and stay out of the options that travel to a
    pool's nodes (each process reads its own environment).
    """

    variables: Mapping[str, str]
    """Each option's environment variable (``{"api_key": "E2B_API_KEY"}``)."""
    missing: str
    """What to do when one is unset: the message of the error, and the backend's unavailable reason."""
    file: str | None = None
    """A file that stands in for the options (``~`` is expanded), or None."""

    def resolve(self, given: Mapping[str, Any]) -> dict[str, str | None]:
        """Each credential option: as ``given`` (a backend's options), else from its environment variable.

        Raises:
            ConfigError: one is still unset, and no ``file`` stands in for them (``missing``).
        """
        values = {option: given.get(option) or os.environ.get(variable) for option, variable in self.variables.items()}
        if not all(values.values()) and not (self.file and Path(self.file).expanduser().is_file()):
            raise ConfigError(self.missing)
        return values

    def unavailable_reason(self, options: Mapping[str, Any]) -> str | None:
        """``missing`` when a backend with ``options`` could not sign in; else None."""
        try:
            self.resolve(options)
        except ConfigError as exc:
            return str(exc)
        return None
