"""One local sandbox's command side: the EXEC fields of its commands, and its persistent shell.

A :class:`Console` is what ``LocalSandbox.exec``, ``run_script`` and ``shell`` hand their work to.
It builds a command's fields from explicit inputs (the snapshot the sandbox started from, and
whether a verifier holds it, are passed on each call: the sandbox's state stays the sandbox's)
and holds the one shell session of the episode. It runs them through :mod:`.commands`, which
knows nothing of it.

A command's variables, each layer over the one before: the backend's base environment, the
snapshot's, the egress proxy's (while the sandbox has a network policy), the call's ``env``.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import Any

from pool.backends.local.cgroups import SandboxCgroup
from pool.backends.local.instance import commands, shellsession
from pool.backends.local.instance.link import SandboxLink
from pool.basesandbox import ExecOptions
from pool.egress.onhost.gatekeeper import Gatekeeper
from pool.errors import SandboxError
from pool.results import ExecResult
from pool.snapshots import Snapshot


class Console:
    """The commands of the sandbox on ``link``, limited by ``cgroup``, with ``egress``'s variables."""

    def __init__(self, link: SandboxLink, cgroup: SandboxCgroup, egress: Gatekeeper) -> None:
        self._link = link
        self._settings = link.runtime.settings
        self._cgroup = cgroup
        self._egress = egress
        self._session: shellsession.ShellSession | None = None

    def exec(self, command: str, options: ExecOptions, start: Snapshot, *, sealed: bool) -> ExecResult:
        """``command`` with ``sh -c`` in a sandbox started at ``start`` (``sealed``: a verifier's command,
        which nothing it starts outlives)."""
        env = self._command_env(options.env)
        fields = self._fields(command, start, options.timeout_s, options.cwd, env, sealed=sealed)
        return commands.run(self._link, fields, options.stdin, **self._limits(options))

    def script(self, path: str, cwd: str, options: ExecOptions, start: Snapshot, *, sealed: bool) -> ExecResult:
        """``/bin/bash path`` (or ``/bin/sh``) in ``cwd`` (or ``/``), started with no ``sh -c`` in front."""
        # The same in sh, for a daemon that would not know the program fields: never an empty command.
        script, where = shlex.quote(path), shlex.quote(cwd)
        same = f"cd -- {where} 2>/dev/null || cd /\nif [ -x /bin/bash ]; then exec /bin/bash {script}; " \
               f"else exec /bin/sh {script}; fi"  # fmt: skip
        fields = self._fields(same, start, options.timeout_s, cwd, self._command_env(options.env), sealed=sealed)
        fields += [("program", "/bin/bash"), ("program", "/bin/sh"), ("arg", path), ("cwd_else", "/")]
        return commands.run(self._link, fields, None, **self._limits(options))

    def step(self, command: str, options: ExecOptions, start: Snapshot, *, sealed: bool) -> ExecResult:
        """``command`` as the next line typed into the episode's shell (see LocalSandbox.shell).

        Raises:
            SandboxError: ``sealed``: a verifier holds the sandbox, and the shell is the agent's.
        """
        session = self._session_for(command, options, start, sealed=sealed)
        return commands.run_step(self._link, session, command, **self._limits(options))

    async def step_async(self, command: str, options: ExecOptions, start: Snapshot, *, sealed: bool) -> ExecResult:
        """:meth:`step` on the running event loop (no thread waits for it)."""
        session = self._session_for(command, options, start, sealed=sealed)
        return await commands.run_step_async(self._link, session, command, **self._limits(options))

    def hang_up(self) -> None:
        """End the shell session, if any (its shell exits once idle); the next step starts a new one."""
        if self._session is not None:
            self._session.close()
            self._session = None

    def _fields(
        self,
        command: str,
        start: Snapshot,
        timeout_s: float | None,
        cwd: str | None,
        env: Mapping[str, str] | None,
        *,
        sealed: bool,
    ) -> list[tuple[str, str]]:
        """The EXEC fields of ``command`` in a sandbox started at ``start`` (see commands.exec_fields);
        ``env``: the call's variables with the egress proxy's (see :meth:`_command_env`)."""
        commands.check_command(command, timeout_s)
        merged = dict(self._settings.base_env(start))
        merged.update(start.env)
        merged.update(env or {})
        return commands.exec_fields(
            command,
            timeout_s=timeout_s if timeout_s is not None else self._settings.default_timeout_s,
            cwd=commands.resolve(start.workdir, cwd or start.workdir),
            env=merged,
            reap_all=sealed,  # nothing the verifier's command starts outlives it
        )

    def _session_for(
        self, command: str, options: ExecOptions, start: Snapshot, *, sealed: bool
    ) -> shellsession.ShellSession:
        """The running session a step goes to (started anew when it ended or its variables differ)."""
        if sealed:
            raise SandboxError("the sandbox is sealed for its verifier; the shell is the agent's (use exec())")
        commands.check_command(command, options.timeout_s)
        env = self._command_env(options.env) or {}
        session = self._session
        if session is None or not session.alive or session.env != dict(env):
            self.hang_up()
            fields = self._fields(shellsession.COMMAND, start, None, None, env, sealed=False)
            session = self._session = commands.open_session(self._link, fields, env)
        return session

    def _command_env(self, env: Mapping[str, str] | None) -> Mapping[str, str] | None:
        """``env`` on top of the egress proxy's variables, while the sandbox has a network policy."""
        if self._egress.environment:
            return {**self._egress.environment, **(env or {})}
        return env

    def _limits(self, options: ExecOptions) -> dict[str, Any]:
        """The output cap, timeout and memory limit of a command with ``options``."""
        return {
            "cap": options.cap_or(self._settings.max_output_bytes),
            "timeout_s": options.timeout_or(self._settings.default_timeout_s),
            "memory_limit_bytes": self._cgroup.limits.memory_bytes,
        }
