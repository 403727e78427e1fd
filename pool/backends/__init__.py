"""Backends behind the sandbox contract, by name.

Each backend is one module (or folder) under ``pool/backends/`` and one YAML
under ``configs/backend/``; this table is the only place that names them.
Modules are imported lazily, so a missing provider SDK matters only when that
backend is asked for, and the error says which extra to install.

A backend's options are its constructor's keyword arguments: that signature
is the one schema (Hydra's ``backend=<name>``, ``gym.make(..., backend=<name>,
backend_options=...)`` and ``SandboxPool(backend=<name>, backend_options=...)``
all go through :func:`load_backend`), and a wrong option is named with the
valid ones.
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import functools
import importlib
import inspect
import os
import typing
from collections.abc import Callable, Mapping
from typing import Any, cast

from pool.contract import Backend
from pool.errors import ConfigError

BACKENDS: dict[str, tuple[str, str | None]] = {
    "local": ("pool.backends.local:LocalBackend", None),
    "docker": ("pool.backends.docker:DockerBackend", "docker"),
    "e2b": ("pool.backends.e2b:E2BBackend", "e2b"),
    "daytona": ("pool.backends.daytona:DaytonaBackend", "daytona"),
    "modal": ("pool.backends.modal:ModalBackend", "modal"),
}
"""name -> ("module:class", the pip extra that brings its SDK, or None)."""

BackendFactory = Callable[[], Backend]


def backend_class(name: str) -> type[Any]:
    """The class of a backend, imported on first use.

    Raises:
        ConfigError: no backend has that name, or its SDK is not installed (the message says
            which ``pip install 'snapgym[extra]'`` brings it).
    """
    try:
        target, extra = BACKENDS[name]
    except (KeyError, TypeError):
        close = difflib.get_close_matches(str(name), BACKENDS, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ConfigError(f"unknown backend {name!r}; choose one of: {', '.join(sorted(BACKENDS))}{hint}") from None
    module_name, attr = target.split(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        hint = f"pip install 'snapgym[{extra}]'" if extra else "reinstall snapgym"
        raise ConfigError(f"backend {name!r} needs a package that is not installed ({exc}); {hint}") from exc
    return cast(type[Any], getattr(module, attr))


def backend_options(name: str) -> dict[str, inspect.Parameter]:
    """The options a backend takes (its constructor's keyword parameters), by name."""
    signature = inspect.signature(backend_class(name).__init__)
    kinds = (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return {p.name: p for p in signature.parameters.values() if p.kind in kinds and p.name != "self"}


def has_model_gateway(name: str) -> bool:
    """Whether the backend can give an agent inside its sandboxes a model gateway with the key kept
    outside: it takes ``egress`` settings, whose model routes its egress proxy serves
    (:mod:`pool.egress.models`). The runner refuses installed agents on a backend without one, and
    the documentation's table says so from this same rule."""
    return "egress" in backend_options(name)


def option_defaults(name: str) -> dict[str, Any]:
    """Every option of a backend with its default, as plain values a config file holds.

    The runner's ``configs/backend/<name>.yaml`` starts from this, so the YAML restates no default
    and every option can be set from the command line (``backend.prewarm=false``). An option whose
    default is None but whose type is a settings dataclass (``registry``, ``egress``) is given that
    dataclass's fields, so one field can be set (``backend.egress.hosts=[...]``); None and an
    all-defaults mapping mean the same to the backend.
    """
    cls = backend_class(name)
    hints = typing.get_type_hints(cls.__init__)
    defaults: dict[str, Any] = {}
    for option, parameter in backend_options(name).items():
        if parameter.default is inspect.Parameter.empty:
            continue
        settings = _settings_type(hints.get(option)) if parameter.default is None else None
        defaults[option] = _plain(settings() if settings else parameter.default)
    return defaults


def cloud_option_defaults() -> dict[str, Any]:
    """The options every cloud backend takes (:class:`~pool.backends.remote.options.RemoteOptions`),
    with their defaults as plain values a config file holds (no provider SDK is imported)."""
    from pool.backends.remote.options import RemoteOptions

    return {name: _plain(value) for name, value in RemoteOptions.defaults().items()}


def _settings_type(hint: Any) -> type[Any] | None:
    """The settings dataclass among the types an option takes (``X | Mapping | None``), if any."""
    for member in typing.get_args(hint):
        if isinstance(member, type) and dataclasses.is_dataclass(member):
            return member
    return None


def _plain(value: Any) -> Any:
    """``value`` as a config file holds it: dataclasses as mappings of their given fields (a field's
    ``config_default`` metadata, where it has one, is the form a config starts from: ``[]`` for a
    mapping that overrides give as a list), tuples as lists, paths and enums as text."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        given = (f for f in dataclasses.fields(value) if f.init)
        return {f.name: _plain(f.metadata.get("config_default", getattr(value, f.name))) for f in given}
    if isinstance(value, Mapping):
        return {str(key): _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple, frozenset, set)):
        return [_plain(item) for item in value]
    if isinstance(value, enum.Enum):
        return _plain(value.value)
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    return value


def check_options(name: str, options: Mapping[str, Any]) -> None:
    """Refuse options a backend does not take, naming them and the valid ones.

    Raises:
        ConfigError: an unknown option (with the closest valid name when there is one).
    """
    valid = set(backend_options(name))
    unknown = sorted(set(options) - valid)
    if not unknown:
        return
    hints = []
    for key in unknown:
        close = difflib.get_close_matches(key, valid, n=1)
        hints.append(f"{key!r} (did you mean {close[0]!r}?)" if close else repr(key))
    raise ConfigError(f"backend {name!r} has no option {', '.join(hints)}; its options are: {', '.join(sorted(valid))}")


def load_backend(name: str | Backend, **options: Any) -> Backend:
    """A backend by name with its options, e.g. ``load_backend("local", memory_limit_mb=512)``.

    A backend instance is returned as it is (it takes no options then).

    Raises:
        ConfigError: an unknown backend or option, a missing SDK, or an option the backend refuses.
    """
    if not isinstance(name, str):
        if options:
            raise ConfigError("options go with a backend name, not with a backend instance")
        return name
    check_options(name, options)
    return cast(Backend, backend_class(name)(**options))


def backend_factory(name: str, options: Mapping[str, Any] | None = None) -> BackendFactory:
    """A picklable maker of the backend, with its options settled here (see ``Backend.resolve_options``).

    A Ray pool calls it inside each host actor, on whichever node that actor runs.
    """
    options = dict(options or {})
    check_options(name, options)
    resolved = backend_class(name).resolve_options(options)
    return functools.partial(load_backend, name, **resolved)


def unavailable_reason(name: str, **options: Any) -> str | None:
    """None when the backend can run here with these options; else why not (see ``Backend.unavailable_reason``)."""
    try:
        check_options(name, options)
        reason: str | None = backend_class(name).unavailable_reason(**options)
    except ConfigError as exc:
        return str(exc)
    return reason


def available_backends() -> dict[str, str | None]:
    """Every backend name -> None when it can run here with default options, else why not."""
    return {name: unavailable_reason(name) for name in BACKENDS}
