"""``sb.filesystem`` for the Modal stand-in's router: the SDK execs
``/__modal/.bin/modal-sandbox-fs-tools '{"Op": {...}}'`` and reads the answer the way it reads a
command's (stdout, stderr, exit code). The stand-in has no such binary; it carries each op out
inside the local sandbox: ``ReadFile``/``WriteFile`` with the sandbox's own file calls (bytes
exact; parents created on write), ``ListFiles``/``Stat``/``MakeDirectory``/``Remove`` with a small
``python3`` program. A failure exits 1 with ``{"error_kind", "message"}`` on stderr, which the SDK
turns into ``SandboxFilesystemNotFoundError``, ``...NotADirectoryError`` and so on.
``Watch`` answers ``Unsupported`` (``SandboxFilesystemError``). PYTEST_DONT_REWRITE.
"""

from __future__ import annotations

import errno
import json
import os
import shlex
from dataclasses import dataclass

from pool import FileOperationError
from pool.backends.local import LocalSandbox

FS_TOOLS = "/__modal/.bin/modal-sandbox-fs-tools"
"""argv[0] of the SDK's filesystem calls."""
_KINDS = {
    errno.ENOENT: "NotFound",
    errno.ENOTDIR: "NotDirectory",
    errno.EISDIR: "IsDirectory",
    errno.EEXIST: "PathAlreadyExists",
    errno.ENOTEMPTY: "DirectoryNotEmpty",
    errno.EACCES: "PermissionDenied",
    errno.EPERM: "PermissionDenied",
    errno.EFBIG: "FileTooLarge",
}


@dataclass(frozen=True, slots=True)
class Outcome:
    """How an exec ended, as the router answers it."""

    code: int
    stdout: bytes = b""
    stderr: bytes = b""
    timed_out: bool = False


def parse(argv: tuple[str, ...]) -> tuple[str, dict[str, object]]:
    """The op name and its arguments (ValueError: not one ``{"Op": {...}}`` argument)."""
    if len(argv) != 2:
        raise ValueError(f"fs-tools takes one JSON argument, got {len(argv) - 1}")
    command = json.loads(argv[1])
    if not isinstance(command, dict) or len(command) != 1:
        raise ValueError("fs-tools takes one {op: args} object")
    ((op, args),) = command.items()
    return op, dict(args)


def run(local: LocalSandbox, op: str, args: dict[str, object]) -> Outcome:
    """Carry out every op but ``WriteFile`` (which needs stdin: :func:`write`)."""
    path = str(args.get("path", ""))
    if op == "ReadFile":
        try:
            return Outcome(0, local.read_file(path))
        except FileOperationError as exc:
            return _failure(_KINDS.get(exc.errno or 0, "Other"), os.strerror(exc.errno or errno.EIO))
    if op in ("ListFiles", "Stat", "MakeDirectory", "Remove"):
        result = local.exec(f"python3 -I -S -c {shlex.quote(_SCRIPT)}", stdin=json.dumps({"op": op, **args}))
        return Outcome(result.exit_code, result.stdout.encode(), result.stderr.encode())
    return _failure("Unsupported", f"the Modal stand-in does not implement the {op} filesystem op")


def write(local: LocalSandbox, args: dict[str, object], data: bytes) -> Outcome:
    """``WriteFile``: all of stdin into ``path``, parents created, the file replaced."""
    try:
        local.write_file(str(args["path"]), data)
    except FileOperationError as exc:
        return _failure(_KINDS.get(exc.errno or 0, "Other"), os.strerror(exc.errno or errno.EIO))
    return Outcome(0)


def _failure(kind: str, message: str) -> Outcome:
    return Outcome(1, stderr=json.dumps({"error_kind": kind, "message": message}).encode())


_SCRIPT = r"""
import errno, grp, json, os, pwd, shutil, stat, sys

def owner(lookup, key):
    try:
        return lookup(key)[0]
    except KeyError:
        return str(key)

def info(path):
    st = os.lstat(path)
    m = st.st_mode
    kind = "directory" if stat.S_ISDIR(m) else "symlink" if stat.S_ISLNK(m) else "file"
    return {"name": os.path.basename(path.rstrip("/")) or "/", "path": path, "type": kind,
            "size": st.st_size, "mode": stat.S_IMODE(m), "permissions": stat.filemode(m),
            "owner": owner(pwd.getpwuid, st.st_uid), "group": owner(grp.getgrgid, st.st_gid),
            "modified_time": st.st_mtime, "symlink_target": os.readlink(path) if stat.S_ISLNK(m) else None}

KINDS = {errno.ENOENT: "NotFound", errno.ENOTDIR: "NotDirectory", errno.EEXIST: "PathAlreadyExists",
         errno.ENOTEMPTY: "DirectoryNotEmpty", errno.EACCES: "PermissionDenied",
         errno.EPERM: "PermissionDenied", errno.EISDIR: "IsDirectory"}
req = json.load(sys.stdin)
op, path = req["op"], req["path"]
out = None
try:
    if op == "ListFiles":
        out = [info(os.path.join(path, name)) for name in sorted(os.listdir(path))]
    elif op == "Stat":
        out = info(path)
    elif op == "MakeDirectory":
        if req.get("parents", True):
            os.makedirs(path, exist_ok=True)
        else:
            os.mkdir(path)
    elif os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path) if req.get("recursive") else os.rmdir(path)
    else:
        os.unlink(path)
except OSError as e:
    sys.stderr.write(json.dumps({"error_kind": KINDS.get(e.errno, "Other"), "message": e.strerror or str(e)}))
    sys.exit(1)
if out is not None:
    sys.stdout.write(json.dumps(out))
""".strip()
"""The ops a ``python3`` in the sandbox carries out: a JSON request on stdin, fs-tools' answer out."""
