"""envd (the daemon in every E2B sandbox) for the stand-in (tests/backends/cloud/e2b/standin.py): the process and
filesystem Connect RPCs, ``/files`` and ``/health``, answered over one snapgym local sandbox.
PYTEST_DONT_REWRITE.

Calls name their sandbox in the ``E2b-Sandbox-Id`` header and carry its ``X-Access-Token``; one for
a sandbox that is gone gets the 502 E2B's proxy answers. ``process.Process/Start`` runs the command
to its end, then streams the start, the output (stdout before stderr) and the end; filesystem RPCs
run :data:`_FS_SCRIPT` with the sandbox's python3.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import gzip
import itertools
import json
import posixpath
import shlex
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from pool import CommandRejectedError, FileOperationError
from pool.backends.local import LocalSandbox
from tests.backends.cloud.e2b import fsshell
from tests.backends.cloud.e2b.lifecycle import Box
from tests.backends.cloud.e2b.wire import api_error, connect_error, end_stream, first_envelope, frame, multipart
from tests.backends.cloud.http_standin import Reply, Request, json_reply

DEFAULT_USER = "user"
_OUTPUT_CHUNK = 32 * 1024
_FS_OPS = {"Stat": "stat", "ListDir": "list", "MakeDir": "mkdir", "Remove": "remove", "Move": "move"}


@dataclass(frozen=True, slots=True)
class CommandRecord:
    """One command envd ran in a local sandbox."""

    sandbox_id: str
    command: str
    """The shell line run, e.g. ``/bin/bash -l -c 'echo hi'``."""
    env: dict[str, str]
    """The variables added for it (the API key replaced by :data:`API_KEY_MARKER`)."""
    cwd: str
    user: str
    timeout_s: float | None
    exit_code: int
    timed_out: bool


@dataclass(frozen=True, slots=True)
class _Run:
    sandbox_id: str
    command: str
    env: dict[str, str]
    cwd: str
    user: str
    timeout_s: float | None


def is_envd(path: str) -> bool:
    """True for a path envd serves rather than the control plane."""
    return path in ("/health", "/files") or path.startswith(("/process.", "/filesystem."))


class Envd:
    """Every sandbox's envd.

    Args:
        live_box: the sandbox of an id, unless it is unknown or killed.
        record_command: told of every command run (the env as run; it redacts).
    """

    def __init__(self, live_box: Callable[[str], Box | None], record_command: Callable[[CommandRecord], None]) -> None:
        self._live_box = live_box
        self._record_command = record_command
        self._pids = itertools.count(1000)

    def handle(self, request: Request) -> Reply:
        sandbox_id = request.headers.get("e2b-sandbox-id", "")
        box = self._live_box(sandbox_id)
        local = box.local if box is not None else None
        if box is None or local is None:  # what E2B's proxy answers for a sandbox that is gone
            return api_error(502, f"The sandbox {sandbox_id} was not found")
        if request.headers.get("x-access-token") != box.token:
            return api_error(401, "unauthorized access, please provide a valid access token")
        if request.path == "/health":
            return Reply(204)
        if request.path == "/files":
            return self._files(local, request)
        if request.path == "/process.Process/Start":
            return self._start(box, local, request)
        service, _, method = request.path.lstrip("/").partition("/")
        if service == "filesystem.Filesystem" and method in _FS_OPS:
            return self._filesystem(local, _FS_OPS[method], request)
        return connect_error("unimplemented", f"{request.path} is not implemented by the stand-in")

    def _start(self, box: Box, local: LocalSandbox, request: Request) -> Reply:
        start = first_envelope(request.body)
        if start.get("pty"):
            return connect_error("unimplemented", "the stand-in has no PTY")
        process = start.get("process") or {}
        user = _user(request)
        command = shlex.join([process.get("cmd", ""), *process.get("args", [])])
        cwd = _resolve(process["cwd"], user) if process.get("cwd") else _home(user)
        env = {"HOME": _home(user), "USER": user, "LOGNAME": user, **box.record.envs, **process.get("envs", {})}
        timeout_ms = int(request.headers.get("connect-timeout-ms") or 0)
        run = _Run(box.record.sandbox_id, command, env, cwd, user, timeout_ms / 1000 if timeout_ms else None)
        stream = self._run(local, run, next(self._pids))
        return Reply(200, content_type="application/connect+json", stream=stream)

    def _run(self, local: LocalSandbox, run: _Run, pid: int) -> Iterator[bytes]:
        yield frame({"event": {"start": {"pid": pid}}})
        try:
            result = local.exec(run.command, timeout_s=run.timeout_s, cwd=run.cwd, env=run.env)
        except CommandRejectedError as exc:
            yield end_stream({"code": "invalid_argument", "message": str(exc)})
            return
        except Exception as exc:  # killed or crashed under the command
            gone = self._live_box(run.sandbox_id) is None
            message = f"The sandbox {run.sandbox_id} was not found" if gone else f"{type(exc).__name__}: {exc}"
            yield end_stream({"code": "unavailable" if gone else "internal", "message": message})
            return
        record = CommandRecord(
            run.sandbox_id, run.command, run.env, run.cwd, run.user, run.timeout_s, result.exit_code, result.timed_out
        )
        self._record_command(record)
        for stream, text in (("stdout", result.stdout), ("stderr", result.stderr)):
            data = text.encode()
            for i in range(0, len(data), _OUTPUT_CHUNK):
                chunk = base64.b64encode(data[i : i + _OUTPUT_CHUNK]).decode()
                yield frame({"event": {"data": {stream: chunk}}})
        if result.timed_out:
            yield end_stream({"code": "deadline_exceeded", "message": f"the command ran past {run.timeout_s} s"})
            return
        end = {"exitCode": result.exit_code, "exited": True, "status": f"exit status {result.exit_code}"}
        yield frame({"event": {"end": end}})
        yield end_stream()

    def _filesystem(self, local: LocalSandbox, op: str, request: Request) -> Reply:
        args = request.json_object()
        user = _user(request)
        for key in ("path", "source", "destination"):
            if key in args:
                args[key] = _resolve(args[key], user)
        result = local.exec(f"python3 -I -S -c {shlex.quote(_FS_SCRIPT)}", stdin=json.dumps({"op": op, **args}))
        try:
            answer = json.loads(result.stdout)
        except ValueError:
            if result.exit_code != 127:  # 127: an image without python3, served from the shell
                return connect_error("internal", f"the filesystem helper failed: {result.stderr.strip()}")
            answer = fsshell.answer(local, op, args)
        if "ok" in answer:
            return json_reply(200, answer["ok"])
        return connect_error(answer["code"], answer["message"])

    def _files(self, local: LocalSandbox, request: Request) -> Reply:
        user = request.arg("username") or DEFAULT_USER
        if request.method == "GET":
            if not request.arg("path"):
                return api_error(400, "path is required")
            try:
                data = local.read_file(_resolve(str(request.arg("path")), user))
            except FileOperationError as exc:
                return _file_error(exc)
            return Reply(200, data, "application/octet-stream")
        content_type = request.headers.get("content-type", "")
        body = request.body
        if request.headers.get("content-encoding") == "gzip":
            body = gzip.decompress(body)
        if content_type.startswith("multipart/form-data"):
            uploads = multipart(content_type, body)
            if len(uploads) == 1 and request.arg("path"):
                uploads = [(str(request.arg("path")), uploads[0][1])]
        elif request.arg("path"):
            uploads = [(str(request.arg("path")), body)]
        else:
            return api_error(400, "path is required")
        written = []
        for path, data in uploads:
            target = _resolve(path, user)
            try:
                local.write_file(target, data)
            except FileOperationError as exc:
                return _file_error(exc)
            written.append({"name": posixpath.basename(target), "type": "file", "path": target})
        return json_reply(200, written)


def _user(request: Request) -> str:
    """The envd user: Basic ``user:`` on RPCs (sent only when the caller names one), else E2B's ``user``."""
    auth = request.headers.get("authorization", "")
    if auth.lower().startswith("basic "):
        with contextlib.suppress(ValueError):
            return base64.b64decode(auth[6:]).decode().partition(":")[0] or DEFAULT_USER
    return DEFAULT_USER


def _home(user: str) -> str:
    return "/root" if user == "root" else f"/home/{user}"


def _resolve(path: str, user: str) -> str:
    """envd's reading of a path: relative ones (and ``~``) start at the user's home."""
    if path == "~" or path.startswith("~/"):
        path = _home(user) + path[1:]
    return posixpath.normpath(posixpath.join(_home(user), path))


def _file_error(exc: FileOperationError) -> Reply:
    status = {errno.ENOENT: 404, errno.EISDIR: 400, errno.ENOSPC: 507, errno.EDQUOT: 507}.get(exc.errno or 0, 500)
    return api_error(status, str(exc))


_FS_SCRIPT = r"""
import errno, grp, json, os, pwd, shutil, stat, sys
from datetime import datetime, timezone

def owner(lookup, key):
    try:
        return lookup(key)[0]
    except KeyError:
        return str(key)

def entry(path):
    st = os.lstat(path)
    info = {"name": os.path.basename(path) or "/", "path": path}
    if stat.S_ISLNK(st.st_mode):
        info.update(isSymlink=True, symlinkTarget=os.readlink(path))
        try:
            st = os.stat(path)
        except OSError:  # a dangling link: envd describes the link itself
            pass
    m = st.st_mode
    kinds = ((stat.S_ISDIR, "DIRECTORY"), (stat.S_ISREG, "FILE"), (stat.S_ISLNK, "SYMLINK"))
    kind = next((name for test, name in kinds if test(m)), "UNSPECIFIED")
    when = datetime.fromtimestamp(st.st_mtime, timezone.utc).isoformat().replace("+00:00", "Z")
    info.update(type="FILE_TYPE_" + kind, size=st.st_size, mode=m & 0o777, permissions=stat.filemode(m),
                owner=owner(pwd.getpwuid, st.st_uid), group=owner(grp.getgrgid, st.st_gid), modifiedTime=when)
    return info

def walk(path, depth):
    found = []
    for name in sorted(os.listdir(path)):
        child = os.path.join(path, name)
        found.append(entry(child))
        if depth > 1 and os.path.isdir(child) and not os.path.islink(child):
            found.extend(walk(child, depth - 1))
    return found

CODES = {errno.ENOENT: "not_found", errno.EEXIST: "already_exists", errno.ENOTDIR: "invalid_argument",
         errno.EISDIR: "invalid_argument", errno.EACCES: "permission_denied", errno.EPERM: "permission_denied"}
req = json.load(sys.stdin)
op, path = req["op"], req.get("path", "")
try:
    if op == "stat":
        out = {"entry": entry(path)}
    elif op == "list":
        if not os.path.isdir(path):
            os.stat(path)
            raise NotADirectoryError(errno.ENOTDIR, "path is not a directory", path)
        out = {"entries": walk(path, max(1, req.get("depth") or 1))}
    elif op == "mkdir":
        if os.path.lexists(path):
            raise FileExistsError(errno.EEXIST, "directory already exists", path)
        os.makedirs(path)
        out = {"entry": entry(path)}
    elif op == "remove":
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.remove(path)
        out = {}
    else:
        src, dst = req["source"], req["destination"]
        os.lstat(src)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        os.rename(src, dst)
        out = {"entry": entry(dst)}
    print(json.dumps({"ok": out}))
except OSError as e:
    print(json.dumps({"code": CODES.get(e.errno, "internal"), "message": "%s: %s" % (e.strerror, e.filename)}))
"""
"""Filesystem RPCs, run by the sandbox's python3 on a JSON request on stdin; prints envd's answer."""
