"""What a sandbox may use: CPUs, memory, disk, GPUs, as a task declares them.

A template carries its :class:`Resources`, its snapshot keeps them, and every
sandbox that starts from the snapshot gets them, on every backend. A field
left ``None`` takes the backend's default (for the local backend, its
``memory_limit_mb``, ``cpus`` and ``disk_limit_mb`` options). A backend that
cannot give what is asked (a GPU without GPUs, say) refuses the build with a
:class:`~pool.errors.ConfigError` that names the field, rather than running
the task on less than it needs.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from pool.errors import ConfigError

DEFAULT_TIMEOUT_S = 600.0
"""How long a command may run when neither its caller nor its task says: a backend's ``default_timeout_s``,
a template's setup steps, a task's build, agent and verifier (Harbor's default for each of those)."""

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]i?b?|b)\s*$", re.IGNORECASE)
_UNIT_MB = {"b": 1 / (1 << 20), "k": 1 / 1024, "m": 1, "g": 1024, "t": 1024 * 1024}


@dataclass(frozen=True, slots=True)
class Resources:
    """The resources each sandbox of a snapshot gets."""

    cpus: float | None = None
    """CPU share, e.g. 1.5; None: the backend's default."""
    memory_mb: int | None = None
    """Memory limit in MiB; None: the backend's default."""
    storage_mb: int | None = None
    """Size of the sandbox's writable disk in MiB; None: the backend's default."""
    gpus: int = 0
    """GPUs per sandbox."""
    gpu_types: tuple[str, ...] = field(default_factory=tuple)
    """Acceptable GPU models (e.g. ``("H100", "A100")``); empty: any."""

    def __post_init__(self) -> None:
        for name in ("cpus", "memory_mb", "storage_mb"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not value > 0):
                raise ConfigError(f"Resources.{name} must be positive or None, got {value!r}")
        if isinstance(self.gpus, bool) or not isinstance(self.gpus, int) or self.gpus < 0:
            raise ConfigError(f"Resources.gpus must be a whole number >= 0, got {self.gpus!r}")
        object.__setattr__(self, "gpu_types", tuple(str(t) for t in self.gpu_types))
        if self.gpu_types and not self.gpus:
            raise ConfigError("Resources.gpu_types is set but gpus is 0; ask for at least one GPU")

    def fingerprint(self) -> dict[str, Any]:
        """The fields as JSON-ready data (part of a template's content hash)."""
        return {**asdict(self), "gpu_types": list(self.gpu_types)}

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> Resources:
        """From :meth:`fingerprint` output (missing keys: defaults)."""
        data = dict(data or {})
        data["gpu_types"] = tuple(data.get("gpu_types", ()))
        return cls(**data)


def parse_size_mb(text: str | int | float, *, what: str) -> int:
    """MiB in a size such as ``"4G"``, ``"512M"``, ``"2GiB"``, ``"1.5g"``, or a number (already MiB).

    Raises:
        ConfigError: naming ``what`` and the value, when it is not a positive size with a unit.
    """
    if isinstance(text, bool) or not isinstance(text, str | int | float):
        raise ConfigError(f"{what} must be a size such as '4G' or '512M', got {text!r}")
    if isinstance(text, str):
        match = _SIZE.match(text)
        if match is None:
            raise ConfigError(f"{what} must be a size with a unit, such as '4G' or '512M', got {text!r}")
        mb = float(match.group(1)) * _UNIT_MB[match.group(2)[0].lower()]
    else:
        mb = float(text)
    if not mb > 0:
        raise ConfigError(f"{what} must be positive, got {text!r}")
    return max(1, round(mb))


def require_supported(resources: Resources, *, backend: str, gpu: bool, gpu_types: Sequence[str] = ()) -> None:
    """Refuse resources a backend cannot give.

    Raises:
        ConfigError: GPUs asked of a backend without them, or of a type it does not have.
    """
    if resources.gpus and not gpu:
        raise ConfigError(
            f"the task asks for {resources.gpus} GPU(s) and the {backend!r} backend has none; "
            "run it on a backend with GPUs (backend=modal) or drop [environment] gpus"
        )
    if resources.gpu_types and gpu_types and not set(resources.gpu_types) & set(gpu_types):
        raise ConfigError(
            f"the task asks for a GPU of type {', '.join(resources.gpu_types)} and the {backend!r} backend "
            f"offers {', '.join(gpu_types)}"
        )
