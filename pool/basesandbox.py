"""What every Sandbox implementation has alike: :class:`BaseSandbox` and the :class:`ExecOptions` it hands on.

The Docker, local and cloud sandboxes and a pool's lease each satisfy :class:`~pool.contract.Sandbox`.
Part of that contract is the same on all four, word for word: the start snapshot and its digest,
the closed flag, ``exec``'s and ``shell``'s keyword options and the context manager. It is written
once here; an implementation receives a command's options as one :class:`ExecOptions` value
(``_exec``, ``_shell``) and writes only what it does its own way.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Self, TypeVar

from pool.errors import SandboxClosedError
from pool.results import ExecResult
from pool.snapshots import Snapshot

Default = TypeVar("Default", bound=float | None)


@dataclass(frozen=True, slots=True)
class ExecOptions:
    """The keyword options of one ``exec`` or ``shell`` call, as given (None: not given, so the
    backend's default applies; ``shell`` takes no ``cwd`` or ``stdin``)."""

    timeout_s: float | None = None
    """Kill the command and everything it started after this long (None: the backend's ``default_timeout_s``)."""
    cwd: str | None = None
    """The working directory (None: the snapshot's workdir)."""
    env: Mapping[str, str] | None = None
    """Variables added to the snapshot's environment."""
    stdin: str | bytes | None = None
    """Data on standard input (None: empty)."""
    max_output_bytes: int | None = None
    """The cap on each of stdout and stderr (None: the backend's)."""

    def timeout_or(self, default: Default) -> float | Default:
        """The timeout: as given, else ``default`` (the backend's; None: no timeout)."""
        return self.timeout_s if self.timeout_s is not None else default

    def cap_or(self, default: int) -> int:
        """The output cap per stream: as given, else ``default`` (the backend's)."""
        return self.max_output_bytes if self.max_output_bytes is not None else default

    def keywords(self) -> dict[str, Any]:
        """The options given, as keyword arguments of ``exec`` (or ``shell``) in plain values that
        another process can receive (a pool's host runs the command)."""
        given = {
            "timeout_s": self.timeout_s,
            "cwd": self.cwd,
            "env": dict(self.env) if self.env else None,
            "stdin": self.stdin,
            "max_output_bytes": self.max_output_bytes,
        }
        return {name: value for name, value in given.items() if value is not None}


class BaseSandbox(abc.ABC):
    """The part of :class:`~pool.contract.Sandbox` that is the same on every implementation.

    Why a base class, where the house otherwise keeps hierarchies to Gymnasium's and the error tree:
    these members are the contract's own surface (``exec`` with its five keywords, ``shell`` with
    its three, the start snapshot and its digest, ``is_closed``, the context manager), identical
    on the Docker, local and cloud sandboxes and on a pool's lease. A function or a held value
    could share the bodies but not the public signatures, which each implementation would have to
    repeat; inherited, they are declared once, and each implementation still satisfies the
    Protocol structurally (nothing checks ``isinstance(x, BaseSandbox)``). Nothing here knows a
    backend: a subclass sets ``_snapshot`` and ``_closed`` through ``__init__`` and gives ``id``,
    ``close``, ``_exec`` and ``_shell``.
    """

    def __init__(self, snapshot: Snapshot) -> None:
        self._snapshot = snapshot
        """The snapshot the sandbox last started from (a restore moves it)."""
        self._closed = False

    @property
    @abc.abstractmethod
    def id(self) -> str:
        """The backend's name for this sandbox."""

    @property
    def start_snapshot(self) -> Snapshot:
        """The snapshot this sandbox last started from (at create or restore)."""
        return self._snapshot

    @property
    def start_digest(self) -> str:
        """Digest of the state this sandbox last started from (equal digests: identical starts)."""
        return self._snapshot.digest

    @property
    def is_closed(self) -> bool:
        """True after close()."""
        return self._closed

    def exec(
        self,
        command: str,
        *,
        timeout_s: float | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: str | bytes | None = None,
        max_output_bytes: int | None = None,
    ) -> ExecResult:
        """Run ``command`` with ``/bin/sh -c`` as root inside the sandbox.

        Args:
            command: shell source; at most 128 KiB (pass data with ``stdin``).
            timeout_s: kill the command and everything it started after this long
                (default: the backend's ``default_timeout_s``).
            cwd: working directory (default: the snapshot's workdir).
            env: variables added to the snapshot's environment (after :meth:`set_network`, on top
                of the egress proxy's).
            stdin: data on standard input (default: empty).
            max_output_bytes: cap per stream (default: the backend's).

        Returns:
            The ExecResult; a non-zero exit or a timeout is data, not an error (timeout: exit 137,
            ``timed_out``).

        Raises:
            CommandRejectedError: the command, env or cwd cannot be passed on.
            SandboxClosedError: the sandbox was closed.
            SandboxCrashedError: the sandbox died; restore() brings it back.
        """
        options = ExecOptions(timeout_s=timeout_s, cwd=cwd, env=env, stdin=stdin, max_output_bytes=max_output_bytes)
        return self._exec(command, options)

    def shell(
        self,
        command: str,
        *,
        timeout_s: float | None = None,
        env: Mapping[str, str] | None = None,
        max_output_bytes: int | None = None,
    ) -> ExecResult:
        """Run ``command`` in the sandbox's persistent shell, which keeps its working directory and
        variables until restore(); the options are as for :meth:`exec`.

        Raises:
            UnsupportedError: the backend has no shell session (``Capabilities.shell_session`` is False).
        """
        return self._shell(command, ExecOptions(timeout_s=timeout_s, env=env, max_output_bytes=max_output_bytes))

    @abc.abstractmethod
    def _exec(self, command: str, options: ExecOptions) -> ExecResult:
        """:meth:`exec`, the implementation's own way."""

    @abc.abstractmethod
    def _shell(self, command: str, options: ExecOptions) -> ExecResult:
        """:meth:`shell`, the implementation's own way (``options.cwd`` and ``options.stdin`` are None)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release the sandbox. Idempotent."""

    def _check_open(self) -> None:
        """Refuse work once closed.

        Raises:
            SandboxClosedError: close() was called.
        """
        if self._closed:
            raise SandboxClosedError(f"sandbox {self.id} is closed; create a new one from the backend")

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
