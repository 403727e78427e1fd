"""The Docker engine at the boundary: the SDK imported lazily, and its errors translated.

Nothing outside this package sees a ``docker.errors`` or ``requests``
exception: every call into the SDK runs inside :func:`engine_errors`, which
turns them into the :mod:`pool.errors` tree (an engine that stopped answering
is a :class:`~pool.errors.HostBrokenError`, a refused request a
:class:`~pool.errors.BackendError`, a missing object whatever the caller says
it means: a gone image is a :class:`~pool.errors.SnapshotNotFoundError`, a gone
container a :class:`~pool.errors.SandboxCrashedError`).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from pool.errors import BackendError, ConfigError, HostBrokenError, SnapgymError

DEFAULT_URL = "unix:///var/run/docker.sock"
INSTALL_HINT = "pip install 'snapgym[docker]'"
START_HINT = "start dockerd or set DOCKER_HOST"
_POOL_SIZE = 64


def sdk() -> Any:
    """The ``docker`` package, imported on first use.

    Raises:
        ConfigError: it is not installed (the message says how to install it).
    """
    try:
        import docker
    except ImportError as exc:
        raise ConfigError(f"the docker backend needs the Docker SDK ({exc}); {INSTALL_HINT}") from None
    return docker


def default_url() -> str:
    """``$DOCKER_HOST``, else the engine's default socket."""
    return os.environ.get("DOCKER_HOST") or DEFAULT_URL


def connect(base_url: str, *, tls_cert_dir: str | None = None, timeout_s: float = 120.0) -> Any:
    """A ``docker.DockerClient`` talking to the engine at ``base_url``.

    Raises:
        HostBrokenError: no engine answers there.
    """
    docker = sdk()
    tls: Any = False
    if tls_cert_dir:
        tls = docker.tls.TLSConfig(
            client_cert=(os.path.join(tls_cert_dir, "cert.pem"), os.path.join(tls_cert_dir, "key.pem")),
            ca_cert=os.path.join(tls_cert_dir, "ca.pem"),
            verify=True,
        )
    with engine_errors(f"connecting to the Docker engine at {base_url}"):
        return docker.DockerClient(base_url=base_url, tls=tls, timeout=timeout_s, max_pool_size=_POOL_SIZE)


def ping(client: Any, *, timeout_s: float = 5.0) -> str | None:
    """None when the engine answers within ``timeout_s``; otherwise why not, in one line."""
    api = client.api
    try:
        response = api._get(api._url("/_ping"), timeout=timeout_s)
        response.raise_for_status()
    except Exception as exc:
        return f"the Docker engine at {api.base_url} does not answer ({_first_line(exc)}); {START_HINT}"
    return None


def unavailable_reason(base_url: str | None, tls_cert_dir: str | None) -> str | None:
    """None when an engine answers at ``base_url`` (default: :func:`default_url`); else why not."""
    try:
        sdk()
    except ConfigError:
        return f"the Docker SDK is not installed; {INSTALL_HINT}"
    url = base_url or default_url()
    try:
        client = connect(url, tls_cert_dir=tls_cert_dir, timeout_s=5.0)
    except SnapgymError as exc:
        return str(exc)
    try:
        return ping(client)
    finally:
        client.close()


@dataclass(frozen=True, slots=True)
class EngineInfo:
    """What the engine says about itself (``docker info``), read once per backend."""

    version: str
    security: tuple[str, ...]
    """The names in SecurityOptions: "userns", "seccomp", "apparmor", "selinux", "rootless"."""
    memory_limit: bool
    pids_limit: bool
    cpu_limit: bool
    storage_driver: str

    @classmethod
    def read(cls, client: Any) -> EngineInfo:
        """Ask the engine."""
        with engine_errors("reading the Docker engine's settings"):
            info = client.info()
        names = []
        for option in info.get("SecurityOptions") or ():
            for part in str(option).split(","):
                if part.startswith("name="):
                    names.append(part.removeprefix("name="))
        return cls(
            version=str(info.get("ServerVersion", "?")),
            security=tuple(names),
            memory_limit=bool(info.get("MemoryLimit", True)),
            pids_limit=bool(info.get("PidsLimit", True)),
            cpu_limit=bool(info.get("CpuCfsQuota", True)),
            storage_driver=str(info.get("Driver", "?")),
        )


@contextlib.contextmanager
def engine_errors(doing: str, *, missing: Callable[[str], SnapgymError] | None = None) -> Iterator[None]:
    """Translate SDK and transport errors raised inside the block into pool.errors.

    Args:
        doing: what the block does, for the message ("creating a sandbox").
        missing: makes the error for a 404 (what a missing object means here);
            default: a BackendError.
    """
    try:
        yield
    except SnapgymError:
        raise
    except Exception as exc:
        raise translate(exc, doing, missing=missing) from None


def translate(exc: BaseException, doing: str, *, missing: Callable[[str], SnapgymError] | None = None) -> SnapgymError:
    """The pool.errors exception for an SDK, transport or OS error."""
    docker = sdk()
    import requests

    why = _explain(exc)
    if isinstance(exc, docker.errors.NotFound) and missing is not None:
        return missing(why)
    if isinstance(exc, requests.exceptions.ConnectionError | ConnectionError | BrokenPipeError):
        return HostBrokenError(f"{doing}: the Docker engine stopped answering ({why}); {START_HINT}")
    if isinstance(exc, requests.exceptions.Timeout | TimeoutError):
        return BackendError(f"{doing}: the Docker engine did not answer in time ({why})")
    if isinstance(exc, docker.errors.DockerException):
        if "Error while fetching server API version" in str(exc):
            return HostBrokenError(f"{doing}: no Docker engine answers ({why}); {START_HINT}")
        return BackendError(f"{doing}: {why}")
    if isinstance(exc, OSError | ValueError | requests.exceptions.RequestException):
        return BackendError(f"{doing}: {why}")
    raise exc


def status_code(exc: BaseException) -> int | None:
    """The HTTP status of an SDK APIError, if it is one."""
    code = getattr(exc, "status_code", None)
    return code if isinstance(code, int) else None


def _explain(exc: BaseException) -> str:
    explanation = getattr(exc, "explanation", None)
    if explanation:
        return _first_line(explanation)
    return _first_line(exc)


def _first_line(value: object) -> str:
    text = str(value).strip() or type(value).__name__
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    return text.splitlines()[0][:500]
