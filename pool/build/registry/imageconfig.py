"""What an image's config says about running in it: :class:`ImageConfig` (environment, working
folder, user, entry point), read from an OCI or Docker image config document."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class ImageConfig:
    """What an image's config says about running in it."""

    env: Mapping[str, str] = field(default_factory=dict)
    """``Config.Env``, as a mapping (a later duplicate wins)."""
    workdir: str | None = None
    """``Config.WorkingDir``; None when unset."""
    user: str | None = None
    """``Config.User`` (``name``, ``uid``, ``uid:gid``...); None when unset."""
    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()

    @classmethod
    def from_image_config(cls, data: Mapping[str, Any]) -> ImageConfig:
        """The fields of an image config document (its ``config`` object)."""
        run = data.get("config") or {}
        if not isinstance(run, dict):
            run = {}
        env: dict[str, str] = {}
        for item in run.get("Env") or ():
            if isinstance(item, str) and "=" in item:
                key, value = item.split("=", 1)
                env[key] = value
        return cls(
            env=env,
            workdir=_text(run.get("WorkingDir")),
            user=_text(run.get("User")),
            entrypoint=_words(run.get("Entrypoint")),
            cmd=_words(run.get("Cmd")),
        )

    def to_dict(self) -> dict[str, Any]:
        """The fields as JSON-ready values."""
        return {
            "env": dict(self.env),
            "workdir": self.workdir,
            "user": self.user,
            "entrypoint": list(self.entrypoint),
            "cmd": list(self.cmd),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ImageConfig:
        """Build from :meth:`to_dict` output (unknown or mistyped fields are dropped)."""
        env = data.get("env")
        return cls(
            env={str(k): str(v) for k, v in env.items()} if isinstance(env, dict) else {},
            workdir=_text(data.get("workdir")),
            user=_text(data.get("user")),
            entrypoint=_words(data.get("entrypoint")),
            cmd=_words(data.get("cmd")),
        )


def _text(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def _words(value: object) -> tuple[str, ...]:
    if isinstance(value, list):
        return tuple(str(v) for v in value)
    return ()
