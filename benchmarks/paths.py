"""Paths in a run's config as users type them: ``~`` and paths relative to where the run started.

Two steps, because Hydra's override grammar has no ``~`` in an unquoted value
(``suite.path=~/tasks`` is a lexer error): :func:`quote_path_arguments` quotes such a value on the
command line before Hydra reads it, and :func:`expand_config_paths` turns every path-valued key of
the composed config (from the command line, a config file or the Python API) into an absolute path,
``~`` expanded and a relative path taken from the directory the run started in (the runner keeps
Hydra's ``hydra.job.chdir=false``, so that is the working directory).
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path

from omegaconf import DictConfig, ListConfig, OmegaConf

PATH_KEYS: tuple[str, ...] = (
    "suite.path",
    "output_dir",
    "resume",
    "agent.path",
    "backend.store_dir",
    "backend.runtime_dir",
    "backend.tls_cert_dir",
    "backend.registry.auth_file",
    "backend.egress.extra_ca_files",
    "backend.egress.ca_dirs",
    "backend.egress.cache.dir",
)
"""Keys whose value is a path or a list of paths."""
IMAGE_KEY = "suite.images"
"""``IMAGE=SOURCE`` entries whose SOURCE may be a path (``docker-archive:~/py.tar``)."""
_ARCHIVE = re.compile(r"^(docker-archive:|oci:)?(.*)$")
_NOT_PATHS = frozenset({"true", "false", "null", "none", ""})


def quote_path_arguments(arguments: Sequence[str]) -> list[str]:
    """``arguments`` with each ``~`` path of a path-valued key quoted so that Hydra's grammar takes it.

    ``suite.path=~/tasks`` becomes ``suite.path='~/tasks'``; in a list (``[~/a.crt,/b.crt]``) each
    such element is quoted. Other arguments, and values already quoted, are left as they are.
    """
    return [_quoted(argument) for argument in arguments]


def _quoted(argument: str) -> str:
    key, sep, value = argument.partition("=")
    if not sep or argument.startswith("-") or key.lstrip("+") not in (*PATH_KEYS, IMAGE_KEY) or "~" not in value:
        return argument
    if value.startswith("[") and value.endswith("]"):
        return f"{key}=[{','.join(_quote(item) for item in value[1:-1].split(','))}]"
    return f"{key}={_quote(value)}"


def _quote(value: str) -> str:
    text = value.strip()
    if "~" not in text or text[:1] in "'\"":
        return value
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def user_path(text: str) -> str:
    """``text`` as an absolute path: ``~`` expanded, a relative path taken from the working directory."""
    return str(Path(os.path.expanduser(text)).absolute())


def expand_config_paths(config: DictConfig) -> None:
    """Make every path-valued key of ``config`` absolute (see :func:`user_path`), in place."""
    for key in PATH_KEYS:
        value = OmegaConf.select(config, key, default=None)
        if isinstance(value, str) and value.strip().lower() not in _NOT_PATHS:
            OmegaConf.update(config, key, user_path(value), merge=False)
        elif isinstance(value, ListConfig):
            OmegaConf.update(config, key, [user_path(str(v)) for v in value], merge=False)
    images = OmegaConf.select(config, IMAGE_KEY, default=None)
    if isinstance(images, ListConfig):
        OmegaConf.update(config, IMAGE_KEY, [_image_entry(str(entry)) for entry in images], merge=False)


def _image_entry(entry: str) -> str:
    """``IMAGE=SOURCE`` with a SOURCE path made absolute: an archive's, or one written ``~/``, ``./``, ``../``."""
    image, sep, source = entry.partition("=")
    found = _ARCHIVE.match(source.strip())
    if not sep or found is None:
        return entry
    transport, rest = found.group(1) or "", found.group(2)
    tag = ""
    if transport == "oci:" and rest.count(":") == 1:
        rest, tag = rest.split(":")
        tag = f":{tag}"
    if transport or rest.startswith(("~", "./", "../")):
        return f"{image}={transport}{user_path(rest)}{tag}"
    return entry
