"""What a scenario gets from the runner (the composed config, a backend, its output folder) and returns."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, cast

from omegaconf import DictConfig, OmegaConf

from pool import Backend, load_backend
from pool.backends import backend_class, has_model_gateway
from pool.contract import DeclaresCapabilities
from pool.errors import ConfigError, SnapgymError


def top_level_key(override: str) -> str:
    """The top-level config key an override sets: ``pool`` for ``+pool.size=4``."""
    return override.lstrip("+~").split("=", 1)[0].split(".", 1)[0]


class Outcome(Protocol):
    """What a scenario hands back: it writes its files and prints a table."""

    def write(self, output_dir: Path) -> Path:
        """Write the results into ``output_dir``; returns the summary.json path."""

    def table(self) -> str:
        """A plain-text table for the terminal."""


class ScenarioStoppedError(SnapgymError):
    """A scenario stopped early (an outage, a failed ledger write) after writing what it finished.

    The runner prints the outcome's table (when there is one), the reason on one line of stderr,
    and exits non-zero.

    Args:
        reason: what stopped it and what to do, in one line.
        outcome: what was written (None when even summary.json could not be written).
        run_dir: the run's directory, which ``resume=`` takes (None: the scenario has none).
        interrupted: Ctrl-C stopped it (the runner exits 130 and prints how to resume).
    """

    def __init__(
        self, reason: str, outcome: Outcome | None, *, run_dir: Path | None = None, interrupted: bool = False
    ) -> None:
        super().__init__(reason)
        self.outcome = outcome
        self.run_dir = run_dir
        self.interrupted = interrupted


@dataclass
class Job:
    """One run of one scenario."""

    config: DictConfig
    """The whole composed config (backend, pool, suite, agent, benchmark, run settings)."""
    output_dir: Path
    """Hydra's run directory (or ``output_dir`` from the config)."""
    overrides: tuple[str, ...] = ()
    """The command line's overrides as given (a scenario that starts runners of its own passes some on)."""
    _backends: list[Backend] = field(default_factory=list)

    @property
    def given(self) -> frozenset[str]:
        """The top-level config keys given on the command line (a resume warns only about those)."""
        return frozenset(top_level_key(override) for override in self.overrides)

    @property
    def settings(self) -> Any:
        """The scenario's own settings, as its schema dataclass."""
        return OmegaConf.to_object(self.config.benchmark)

    def backend_options(self) -> dict[str, Any]:
        """The backend's keyword options (everything under ``backend`` but ``name``), with the model route
        an installed agent needs added to ``egress.models`` unless the backend names that route itself."""
        options = cast(dict[str, Any], OmegaConf.to_container(self.config.backend, resolve=True))
        options.pop("name")
        route = self.config.get("agent", {}).get("model_route")
        if route is not None and not has_model_gateway(self.config.backend.name):
            raise ConfigError(
                f"agent {self.config.agent.get('kind')} runs inside the sandbox and reaches its model through the "
                f"egress proxy's model gateway, which the {self.config.backend.name} backend does not have; "
                "use backend=local or backend=docker"
            )
        if route is not None:
            egress = dict(options.get("egress") or {})
            routes = list(egress.get("models") or [])
            wanted = cast(dict[str, Any], OmegaConf.to_container(route, resolve=True))
            if wanted.get("name") not in {r.get("name") for r in routes if isinstance(r, dict)}:
                egress["models"] = [*routes, wanted]
            options["egress"] = egress
        return options

    def open_backend(self) -> Backend:
        """A new backend as the config describes it; closed by :meth:`close`."""
        backend = load_backend(self.config.backend.name, **self.backend_options())
        self._backends.append(backend)
        return backend

    def gpu_backend_spec(self) -> tuple[str, dict[str, Any]] | None:
        """``gpu_backend`` as (name, options), or None when the run has one backend.

        Raises:
            ConfigError: a ``gpu_backend`` without a name, or one whose backend has no GPUs.
        """
        value = self.config.get("gpu_backend")
        if value is None:
            return None
        spec = OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value
        if isinstance(spec, str):
            spec = {"name": spec}
        if not isinstance(spec, dict) or not spec.get("name"):
            raise ConfigError(f"gpu_backend must name a backend ({{name: modal, ...options}}), got {spec!r}")
        options = {str(k): v for k, v in spec.items() if k != "name"}
        name = str(spec["name"])
        cls = backend_class(name)
        if isinstance(cls, DeclaresCapabilities) and not cls.declared_capabilities().gpu:
            raise ConfigError(f"gpu_backend={name!r} has no GPUs; use a backend with GPUs (modal)")
        return name, options

    def open_named_backend(self, name: str, options: dict[str, Any]) -> Backend:
        """Another backend of the run (the GPU one); closed by :meth:`close`."""
        backend = load_backend(name, **options)
        self._backends.append(backend)
        return backend

    @property
    def backend(self) -> Backend:
        """The job's backend, opened on first use."""
        return self._backends[0] if self._backends else self.open_backend()

    def close(self) -> None:
        """Close every backend this job opened."""
        for backend in self._backends:
            with contextlib.suppress(SnapgymError):
                backend.close()
        self._backends.clear()
