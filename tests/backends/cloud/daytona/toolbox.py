"""The toolbox (the daemon in every Daytona sandbox) for the stand-in: ``process/*`` answered over
one snapgym local sandbox, ``files/*`` by tests/backends/cloud/daytona/files.py. PYTEST_DONT_REWRITE.

``process/execute`` does what the daemon does: the command goes on the standard input of the first
of zsh, bash or sh, with stderr merged into stdout (``result``), and a timeout is a 408
``PROCESS_EXECUTION_TIMEOUT`` whose output is lost. Sessions keep the working directory and the
exported variables from one command to the next (through files under :data:`SESSION_DIR` inside
the sandbox, as the daemon keeps its session files there too) and give stdout and stderr apart.
"""

from __future__ import annotations

import re
import shlex
import threading
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pool.backends.local import LocalSandbox
from pool.results import ExecResult
from tests.backends.cloud.daytona.files import Files
from tests.backends.cloud.daytona.wire import daemon_error
from tests.backends.cloud.http_standin import Reply, Request, json_reply

SESSION_DIR = "/tmp/.daytona-standin/sessions"
"""Where a session's command, working directory and exported variables live inside the sandbox."""
_ENV_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_NO_CWD = "snapgym: cannot enter working directory"


def _shell(merge_stderr: bool) -> str:
    """The daemon's shell, reading its script from stdin: the first of zsh, bash, sh."""
    redirect = " 2>&1" if merge_stderr else ""
    shells = "/usr/bin/zsh /bin/zsh /usr/bin/bash /bin/bash"
    return f'for s in {shells}; do [ -x "$s" ] && exec "$s"{redirect}; done; exec sh{redirect}'


_SESSION_SCRIPT = """d={dir}
[ -f "$d/env" ] && . "$d/env" 2>/dev/null
[ -f "$d/cwd" ] && cd "$(cat "$d/cwd")"
{{ . "$d/cmd.sh"; }} </dev/null
ec=$?
pwd > "$d/cwd"; export -p > "$d/env"
exit $ec
"""


@dataclass(frozen=True, slots=True)
class CommandRecord:
    """One command the toolbox ran in a local sandbox."""

    sandbox_id: str
    command: str
    """As the caller sent it."""
    env: dict[str, str]
    """The variables added for it: the sandbox's ``env_vars`` and the call's ``envs`` (the API key masked)."""
    cwd: str | None
    timeout_s: float | None
    exit_code: int
    timed_out: bool
    session_id: str | None = None
    """The session it ran in; None for ``process.exec``."""


@dataclass(slots=True)
class _SessionCommand:
    id: str
    command: str
    exit_code: int | None = None
    stdout: str = ""
    stderr: str = ""

    def json(self) -> dict[str, Any]:
        return {"id": self.id, "command": self.command, "exitCode": self.exit_code}


@dataclass(slots=True)
class _Session:
    id: str
    commands: dict[str, _SessionCommand]
    lock: threading.Lock

    def json(self) -> dict[str, Any]:
        return {"sessionId": self.id, "commands": [c.json() for c in self.commands.values()]}


class Toolbox:
    """The daemon of one started sandbox; a stop ends it (and its sessions) with the local sandbox.

    Args:
        sandbox_id: the Daytona sandbox it serves.
        local: where its commands and files live.
        env: the sandbox's ``env_vars``, added to every command.
        workdir: where relative paths and commands start.
        home: what ``user-home-dir`` answers.
        session_timeout_s: how long a session command may run (the daemon has no limit).
        record: called with every command run.
    """

    def __init__(
        self,
        sandbox_id: str,
        local: LocalSandbox,
        *,
        env: Mapping[str, str],
        workdir: str,
        home: str,
        session_timeout_s: float | None,
        record: Callable[[CommandRecord], None],
    ) -> None:
        self.sandbox_id = sandbox_id
        self.local = local
        self.env = dict(env)
        self.workdir = workdir
        self.home = home
        self.session_timeout_s = session_timeout_s
        self._record = record
        self._sessions: dict[str, _Session] = {}
        self._lock = threading.Lock()
        s = r"([^/]+)"
        self._routes: list[tuple[str, re.Pattern[str], Callable[..., Reply]]] = [
            ("POST", re.compile(r"/process/execute"), self._execute),
            ("POST", re.compile(r"/process/session"), self._create_session),
            ("GET", re.compile(r"/process/session"), self._list_sessions),
            ("GET", re.compile(f"/process/session/{s}"), self._get_session),
            ("DELETE", re.compile(f"/process/session/{s}"), self._delete_session),
            ("POST", re.compile(f"/process/session/{s}/exec"), self._session_execute),
            ("GET", re.compile(f"/process/session/{s}/command/{s}"), self._get_command),
            ("GET", re.compile(f"/process/session/{s}/command/{s}/logs"), self._command_logs),
            ("GET", re.compile(r"/user-home-dir"), lambda r: json_reply(200, {"dir": self.home})),
            ("GET", re.compile(r"/work-dir"), lambda r: json_reply(200, {"dir": self.workdir})),
        ]
        files = Files(local, workdir=workdir)
        self._routes += [(method, re.compile(path), handler) for method, path, handler in files.routes]

    def handle(self, request: Request, path: str) -> Reply:
        """Answer a toolbox call; ``path`` is what follows ``/toolbox/{sandboxId}``."""
        for method, pattern, handler in self._routes:
            match = pattern.fullmatch(path)
            if match and method == request.method:
                return handler(request, *match.groups())
        return daemon_error(request, 404, f"the stand-in has no toolbox route {request.method} {path}", "NOT_FOUND")

    # -- process --------------------------------------------------------------------------

    def _execute(self, request: Request) -> Reply:
        body = request.json()
        command, envs = body.get("command"), body.get("envs") or {}
        if not isinstance(command, str) or not command.strip():
            return daemon_error(request, 400, "bad request: command cannot be empty or whitespace-only", "BAD_REQUEST")
        if bad := [key for key in envs if not _ENV_KEY.fullmatch(key)]:
            return daemon_error(
                request, 400, f"bad request: invalid environment variable name: '{bad[0]}'", "BAD_REQUEST"
            )
        timeout = body.get("timeout") or None
        cwd = body.get("cwd")
        result = self._run(command, _shell(True), stdin=command, cwd=cwd, env=envs, timeout_s=timeout)
        if result.timed_out:
            message = f"Command execution timed out after {timeout} seconds"
            return daemon_error(request, 408, message, "PROCESS_EXECUTION_TIMEOUT")
        if result.exit_code == 126 and result.stderr.startswith(_NO_CWD):  # the daemon could not start it
            return json_reply(200, {"exitCode": -1, "result": f"chdir {cwd}: no such file or directory"})
        return json_reply(200, {"exitCode": result.exit_code, "result": result.stdout})

    def _run(
        self,
        command: str,
        shell: str,
        *,
        stdin: str,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout_s: float | None,
        session_id: str | None = None,
    ) -> ExecResult:
        merged = {**self.env, **(env or {})}
        result = self.local.exec(shell, stdin=stdin, cwd=cwd, env=merged, timeout_s=timeout_s)
        self._record(
            CommandRecord(
                self.sandbox_id, command, merged, cwd, timeout_s, result.exit_code, result.timed_out, session_id
            )
        )
        return result

    def _create_session(self, request: Request) -> Reply:
        session_id = str(request.json().get("sessionId") or "")
        if not session_id or session_id == "entrypoint":
            return daemon_error(request, 400, f"bad request: session id {session_id!r} is reserved", "BAD_REQUEST")
        with self._lock:
            if session_id in self._sessions:
                return daemon_error(request, 409, "conflict: session already exists", "CONFLICT")
            self._sessions[session_id] = _Session(session_id, {}, threading.Lock())
        return Reply(201)

    def _list_sessions(self, request: Request) -> Reply:
        with self._lock:
            return json_reply(200, [s.json() for s in self._sessions.values()])

    def _session(self, request: Request, session_id: str) -> _Session | Reply:
        with self._lock:
            session = self._sessions.get(session_id)
        return session or daemon_error(request, 404, "not found: session not found", "NOT_FOUND")

    def _get_session(self, request: Request, session_id: str) -> Reply:
        session = self._session(request, session_id)
        return session if isinstance(session, Reply) else json_reply(200, session.json())

    def _delete_session(self, request: Request, session_id: str) -> Reply:
        with self._lock:
            found = self._sessions.pop(session_id, None)
        return Reply(204) if found else daemon_error(request, 404, "not found: session not found", "NOT_FOUND")

    def _session_execute(self, request: Request, session_id: str) -> Reply:
        session = self._session(request, session_id)
        if isinstance(session, Reply):
            return session
        body = request.json()
        command = body.get("command")
        if not isinstance(command, str) or not command.strip():
            return daemon_error(request, 400, "bad request: command cannot be empty", "BAD_REQUEST")
        entry = _SessionCommand(str(uuid.uuid4()), command)
        session.commands[entry.id] = entry
        if body.get("runAsync") or body.get("async"):
            threading.Thread(target=self._session_run, args=(session, entry), daemon=True).start()
            return json_reply(202, {"cmdId": entry.id})
        self._session_run(session, entry)
        reply = {"cmdId": entry.id, "output": entry.stdout + entry.stderr, "exitCode": entry.exit_code}
        return json_reply(200, {**reply, "stdout": entry.stdout, "stderr": entry.stderr})

    def _session_run(self, session: _Session, entry: _SessionCommand) -> None:
        """One command in the session's shell; the shell runs one at a time."""
        folder = f"{SESSION_DIR}/{uuid.uuid5(uuid.NAMESPACE_URL, session.id).hex}"
        with session.lock:
            try:
                self.local.write_file(f"{folder}/cmd.sh", entry.command)
                script = _SESSION_SCRIPT.format(dir=shlex.quote(folder))
                result = self._run(
                    entry.command, _shell(False), stdin=script, timeout_s=self.session_timeout_s, session_id=session.id
                )
            except Exception as exc:  # the sandbox stopped under it: the daemon's shell would be gone too
                entry.stderr, entry.exit_code = f"{type(exc).__name__}: {exc}\n", -1
                return
            entry.stdout, entry.stderr, entry.exit_code = result.stdout, result.stderr, result.exit_code

    def _get_command(self, request: Request, session_id: str, command_id: str) -> Reply:
        session = self._session(request, session_id)
        if isinstance(session, Reply):
            return session
        entry = session.commands.get(command_id)
        if entry is None:
            return daemon_error(request, 404, "not found: command not found", "NOT_FOUND")
        return json_reply(200, entry.json())

    def _command_logs(self, request: Request, session_id: str, command_id: str) -> Reply:
        if request.arg("follow") == "true":
            return daemon_error(request, 400, "the stand-in streams no logs; poll without follow", "BAD_REQUEST")
        session = self._session(request, session_id)
        if isinstance(session, Reply):
            return session
        entry = session.commands.get(command_id)
        if entry is None:
            return daemon_error(request, 404, "not found: command not found", "NOT_FOUND")
        return json_reply(200, {"output": entry.stdout + entry.stderr, "stdout": entry.stdout, "stderr": entry.stderr})
