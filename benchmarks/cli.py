"""What ``python -m benchmarks.run`` checks and prints before Hydra takes the command line: a nested key
that does not exist, named with the closest valid ones, and a ``--help`` that lists what a user can pick."""

from __future__ import annotations

import difflib
import re
from collections.abc import Sequence
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf

from pool import ConfigError

CONFIG_DIR = Path(__file__).resolve().parent / "configs"
"""The Hydra configs: ``configs/`` in a checkout (``benchmarks/configs`` links to it), carried as
package data into an installed snapgym."""
_NOT_OVERRIDABLE = re.compile(r"Could not override '([^']+)'")


def config_overrides(arguments: Sequence[str]) -> list[str]:
    """The config overrides among the arguments (not Hydra's own, not flags)."""
    return [a for a in arguments if "=" in a and not a.startswith("-") and not a.lstrip("+~").startswith("hydra")]


def compose_config(overrides: Sequence[str]) -> DictConfig:
    """The run's config as Hydra composes it from ``configs/`` and ``overrides``."""
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        return compose("config", overrides=list(overrides))


def check_choices(arguments: Sequence[str]) -> None:
    """Refuse a choice no config group has (``backend=dockr``), suggesting the closest and listing all.

    Raises:
        ConfigError: ``unknown backend 'dockr'; did you mean docker? (daytona, docker, e2b, local, modal)``.
    """
    for argument in config_overrides(arguments):
        group, _, value = argument.lstrip("+").partition("=")
        folder = CONFIG_DIR / group
        if "." in group or "@" in group or not folder.is_dir() or "(" in value:
            continue  # a key, not a group; or a sweep function (range(...), choice(...)) Hydra expands
        options = sorted(p.stem for p in folder.glob("*.yaml"))
        for choice in (v.strip() for v in value.split(",")):
            if choice not in options:
                close = difflib.get_close_matches(choice, options, n=1)
                listed = (
                    f"did you mean {close[0]}? ({', '.join(options)})"
                    if close
                    else f"choose one of: {', '.join(options)}"
                )
                raise ConfigError(f"unknown {group} {choice!r}; {listed}")


def check_nested_keys(arguments: Sequence[str]) -> None:
    """Refuse an override of a nested key that does not exist (``pool.siz=3``), suggesting the closest.

    Raises:
        ConfigError: naming the key, the closest valid keys at its level, and all of them.
    """
    overrides = config_overrides(arguments)
    if any("," in value for value in overrides):  # a multirun sweep: Hydra checks each run
        return
    try:
        compose_config(overrides)
    except HydraException as exc:
        found = _NOT_OVERRIDABLE.search(str(exc))
        if found is None:
            return  # another problem: Hydra says it as it runs
        key = found.group(1)
        others = [o for o in overrides if o.lstrip("+~").split("=", 1)[0] != key]
        try:
            node = OmegaConf.select(compose_config(others), key.rsplit(".", 1)[0]) if "." in key else None
        except HydraException:
            node = None
        if not isinstance(node, DictConfig):
            raise ConfigError(f"unknown config key {key!r}") from None
        valid = sorted(map(str, node.keys()))
        if not valid:  # an open mapping (agent.kwargs): Hydra adds keys to it only with a +
            raise ConfigError(f"{key!r} is a new key of an open mapping; add it with a +: +{key}=...") from None
        name = key.rsplit(".", 1)[1]
        close = difflib.get_close_matches(name, valid, n=3)
        hint = f"did you mean {', '.join(close)}? " if close else ""
        raise ConfigError(f"unknown config key {key!r}; {hint}valid keys there: {', '.join(valid)}") from None


def help_text(arguments: Sequence[str]) -> str:
    """``--help``: the config groups and their options, then the composed config."""
    groups = []
    for folder in sorted(p for p in CONFIG_DIR.iterdir() if p.is_dir() and not p.name.startswith(".")):
        options = sorted(p.stem for p in folder.glob("*.yaml"))
        if options:
            groups.append(f"{folder.name}: {', '.join(options)}")
    config = OmegaConf.to_yaml(compose_config(config_overrides(arguments)))
    return (
        "python -m benchmarks.run [group=option ...] [key=value ...]\n\n"
        "== Config groups (group=option) ==\n" + "\n".join(groups) + "\n\n"
        "== Config (override any key: foo.bar=value) ==\n" + config
    )
