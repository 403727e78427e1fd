"""The ``files/*`` calls of the Daytona stand-in's toolbox (tests/backends/cloud/daytona/toolbox.py), answered
over one snapgym local sandbox as the daemon answers them. PYTEST_DONT_REWRITE.

Relative paths start at the sandbox's working directory. Uploads land as root with mode 0644
(Daytona: the sandbox user); info gives the owner and group as numeric ids and ``mode`` as Go
prints it (``-rw-r--r--``). A missing path is a 404 ``FILE_NOT_FOUND``, which the SDK raises as
``DaytonaFileNotFoundError``. Bulk downloads answer multipart with the daemon's fixed boundary
``DAYTONA-FILE-BOUNDARY``, so a file holding that line cannot be downloaded, as on Daytona.
"""

from __future__ import annotations

import errno
import json
import mimetypes
import posixpath
import re
import shlex
from collections.abc import Callable

from pool import CommandRejectedError, FileOperationError
from pool.backends.local import LocalSandbox
from tests.backends.cloud.daytona.wire import (
    DOWNLOAD_BOUNDARY,
    daemon_error,
    daemon_error_body,
    multipart_part,
    parse_multipart,
)
from tests.backends.cloud.http_standin import Reply, Request, json_reply

_FILE_ERRORS = {
    errno.ENOENT: (404, "FILE_NOT_FOUND"),
    errno.EACCES: (403, "FILE_ACCESS_DENIED"),
    errno.EPERM: (403, "FILE_ACCESS_DENIED"),
    errno.EISDIR: (400, "INVALID_FILE_PATH"),
    errno.ENOTDIR: (400, "INVALID_FILE_PATH"),
    errno.EINVAL: (400, "INVALID_FILE_PATH"),
    errno.EEXIST: (400, "BAD_REQUEST"),
    errno.ENOTEMPTY: (400, "BAD_REQUEST"),
}


class Files:
    """The file calls on one local sandbox; :attr:`routes` are (method, path, handler) for the toolbox."""

    def __init__(self, local: LocalSandbox, *, workdir: str) -> None:
        self.local = local
        self.workdir = workdir
        self.routes: list[tuple[str, str, Callable[[Request], Reply]]] = [
            ("GET", "/files", lambda r: self._op(r, "list", path=r.arg("path", "."))),
            ("GET", "/files/info", lambda r: self._op(r, "info", path=r.arg("path"))),
            ("POST", "/files/folder", lambda r: self._op(r, "mkdir", path=r.arg("path"))),
            ("DELETE", "/files", lambda r: self._op(r, "delete", path=r.arg("path"))),
            ("POST", "/files/move", lambda r: self._op(r, "move", path=r.arg("source"))),
            ("POST", "/files/bulk-upload", self.upload),
            ("POST", "/files/bulk-download", self.download),
        ]

    def _resolve(self, path: str) -> str:
        return posixpath.normpath(posixpath.join(self.workdir, path))

    def _op(self, request: Request, op: str, *, path: str | None) -> Reply:
        """One call the sandbox's python3 answers with :data:`_FS_SCRIPT`."""
        if not path:
            return daemon_error(request, 400, "bad request: path is required", "BAD_REQUEST")
        mode = request.arg("mode") or "755"
        if not re.fullmatch(r"[0-7]{1,4}", mode):
            return daemon_error(request, 400, "bad request: invalid mode format", "BAD_REQUEST")
        args = {
            "op": op,
            "path": self._resolve(path),
            "depth": int(request.arg("depth") or 1),
            "mode": mode,
            "recursive": request.arg("recursive") == "true",
            "destination": self._resolve(request.arg("destination") or "."),
        }
        result = self.local.exec(f"python3 -I -S -c {shlex.quote(_FS_SCRIPT)}", stdin=json.dumps(args))
        try:
            answer = json.loads(result.stdout)
        except ValueError:
            return daemon_error(
                request, 500, f"the file helper failed: {result.stderr.strip()}", "INTERNAL_SERVER_ERROR"
            )
        if "errno" in answer:
            status, code = _FILE_ERRORS.get(answer["errno"], (500, "INTERNAL_SERVER_ERROR"))
            return daemon_error(request, answer.get("status", status), answer["message"], answer.get("code", code))
        if op in ("mkdir", "delete", "move"):
            return Reply({"mkdir": 201, "delete": 204, "move": 200}[op])
        return json_reply(200, answer["ok"])

    def upload(self, request: Request) -> Reply:
        try:
            parts = parse_multipart(request.headers.get("content-type", ""), request.body)
        except ValueError:
            return json_reply(400, {"errors": ["invalid multipart form"]})
        paths: dict[str, str] = {}
        files, errors = [], []
        for part in parts:
            index = part.name.removeprefix("files[").rpartition("]")[0]
            if part.name.endswith(".path"):
                paths[index] = part.data.decode().strip()
            elif part.name.endswith(".file"):
                if index not in paths:
                    errors.append(f"file[{index}]: missing .path metadata")
                    continue
                try:
                    self.local.write_file(self._resolve(paths[index]), part.data)
                except (FileOperationError, CommandRejectedError) as exc:
                    errors.append(f"{paths[index]}: create: {exc}")
                    continue
                files.append({"path": paths[index], "bytes": len(part.data)})
        if errors:
            return json_reply(400, {"errors": errors, "files": files})
        return json_reply(200, {"files": files})

    def download(self, request: Request) -> Reply:
        body = request.json()
        paths = body.get("paths") if isinstance(body, dict) else None
        if not paths:
            return json_reply(400, {"error": 'request body must be {"paths": [ ... ]} and non-empty'})
        chunks = []
        for path in paths:
            try:
                if not path:
                    raise FileOperationError(errno.EINVAL, "invalid file path: path is empty", path)
                data = self.local.read_file(self._resolve(path))
            except FileOperationError as exc:
                status, code = _FILE_ERRORS.get(exc.errno or 0, (500, "FILE_READ_FAILED"))
                message = {404: f"file not found: {path}", 403: f"permission denied: {path}"}.get(status, str(exc))
                error = daemon_error_body(status, message, code, path, request.method)
                chunks.append(
                    multipart_part("error", path, "application/json; charset=utf-8", json.dumps(error).encode())
                )
                continue
            kind = mimetypes.guess_type(path)[0] or "application/octet-stream"
            chunks.append(multipart_part("file", path, kind, data))
        body = b"".join(chunks) + f"--{DOWNLOAD_BOUNDARY}--\r\n".encode()
        return Reply(200, body, f"multipart/form-data; boundary={DOWNLOAD_BOUNDARY}")


_FS_SCRIPT = r"""
import errno, json, os, shutil, stat, sys
from datetime import datetime, timezone

def info(path):
    st = os.stat(path)
    when = datetime.fromtimestamp(st.st_mtime_ns // 10**9, timezone.utc)
    ns = st.st_mtime_ns % 10**9
    frac = ("." + ("%09d" % ns).rstrip("0")) if ns else ""
    return {"name": os.path.basename(path) or "/", "path": path, "size": st.st_size, "isDir": stat.S_ISDIR(st.st_mode),
            "mode": stat.filemode(st.st_mode), "permissions": "%04o" % (st.st_mode & 0o777),
            "owner": str(st.st_uid), "group": str(st.st_gid),
            "modTime": when.strftime("%Y-%m-%d %H:%M:%S") + frac + " +0000 UTC",
            "modifiedAt": when.strftime("%Y-%m-%dT%H:%M:%S") + frac + "Z"}

def walk(path, depth):
    found = []
    for name in sorted(os.listdir(path)):
        child = os.path.join(path, name)
        try:
            found.append(info(child))
        except OSError:
            continue
        if depth > 1 and found[-1]["isDir"]:
            found.extend(walk(child, depth - 1))
    return found

req = json.load(sys.stdin)
op, path = req["op"], req["path"]
try:
    out = None
    if op == "info":
        out = info(path)
    elif op == "list":
        if not os.path.isdir(path):
            os.stat(path)
            raise NotADirectoryError(errno.ENOTDIR, "not a directory", path)
        out = walk(path, req["depth"])
    elif op == "mkdir":
        os.makedirs(path, int(req["mode"], 8), exist_ok=True)
    elif op == "delete":
        if stat.S_ISDIR(os.stat(path).st_mode) and not req["recursive"]:
            print(json.dumps({"errno": 0, "status": 400, "code": "BAD_REQUEST",
                              "message": "bad request: cannot delete directory without recursive flag"}))
            sys.exit()
        shutil.rmtree(path) if os.path.isdir(path) and not os.path.islink(path) else os.remove(path)
    else:
        os.rename(path, req["destination"])
    print(json.dumps({"ok": out}))
except OSError as e:
    print(json.dumps({"errno": e.errno, "message": "%s: %s" % (e.strerror, e.filename)}))
"""
"""File calls, run by the sandbox's python3 on a JSON request on stdin; prints the answer."""
