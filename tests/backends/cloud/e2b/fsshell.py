"""envd's filesystem RPCs in a sandbox without python3 (a task image such as Debian's minbase): the
same answers as the stand-in's python helper, from POSIX shell and coreutils (``stat``, ``find``,
``mkdir``, ``rm``, ``mv``), as E2B's own envd (a Go binary) serves them in any image.
PYTEST_DONT_REWRITE."""

from __future__ import annotations

import posixpath
import shlex
from datetime import UTC, datetime
from typing import Any

from pool.backends.local import LocalSandbox

_STAT = "stat -c '%F|%s|%a|%A|%U|%G|%Y|%n' --"
_KINDS = {"directory": "DIRECTORY", "regular file": "FILE", "regular empty file": "FILE", "symbolic link": "SYMLINK"}


def answer(local: LocalSandbox, op: str, args: dict[str, Any]) -> dict[str, Any]:
    """``{"ok": ...}`` or ``{"code", "message"}``, as the python helper prints them."""
    path = str(args.get("path", ""))
    quoted = shlex.quote(path)
    if op == "mkdir":
        made = local.exec(f"if [ -e {quoted} ] || [ -L {quoted} ]; then exit 17; fi; mkdir -p -- {quoted}")
        if made.exit_code == 17:
            return {"code": "already_exists", "message": f"directory already exists: {path}"}
        return _entry_answer(local, path) if made.ok else _failed(made.stderr, path)
    if op == "stat":
        return _entry_answer(local, path)
    if op == "list":
        depth = max(1, int(args.get("depth") or 1))
        listing = f"find {quoted} -mindepth 1 -maxdepth {depth} -exec {_STAT} {{}} + | sort -t'|' -k8"
        listed = local.exec(f"[ -d {quoted} ] || {{ [ -e {quoted} ] && exit 20; exit 2; }}; {listing}")
        if listed.exit_code == 20:
            return {"code": "invalid_argument", "message": f"path is not a directory: {path}"}
        if not listed.ok:
            return _failed(listed.stderr or "No such file or directory", path)
        return {"ok": {"entries": [_entry(line) for line in listed.stdout.splitlines() if line]}}
    if op == "remove":
        gone = local.exec(f"[ -e {quoted} ] || [ -L {quoted} ] || exit 2; rm -rf -- {quoted}")
        return {"ok": {}} if gone.ok else _failed("No such file or directory", path)
    source, dest = str(args["source"]), str(args["destination"])
    moved = local.exec(f"mkdir -p -- {shlex.quote(posixpath.dirname(dest))} && mv -- {shlex.quote(source)} "
                       f"{shlex.quote(dest)}")  # fmt: skip
    return _entry_answer(local, dest) if moved.ok else _failed(moved.stderr, source)


def _entry_answer(local: LocalSandbox, path: str) -> dict[str, Any]:
    found = local.exec(f"{_STAT} {shlex.quote(path)}")
    if not found.ok:
        return _failed(found.stderr or "No such file or directory", path)
    info = _entry(found.stdout.strip())
    if info["type"] == "FILE_TYPE_SYMLINK":
        target = local.exec(f"readlink -- {shlex.quote(path)}").stdout.rstrip("\n")
        info.update(isSymlink=True, symlinkTarget=target)
    return {"ok": {"entry": info}}


def _entry(line: str) -> dict[str, Any]:
    kind, size, mode, permissions, user, group, mtime, path = line.split("|", 7)
    when = datetime.fromtimestamp(int(mtime), UTC).isoformat().replace("+00:00", "Z")
    kind = "FILE_TYPE_" + _KINDS.get(kind, "UNSPECIFIED")
    return {
        "name": posixpath.basename(path) or "/",
        "path": path,
        "type": kind,
        "size": int(size),
        "mode": int(mode, 8),
        "permissions": permissions,
        "owner": user,
        "group": group,
        "modifiedTime": when,
    }


def _failed(stderr: str, path: str) -> dict[str, Any]:
    lowered = stderr.lower()
    code = "not_found" if "no such file" in lowered else "permission_denied" if "denied" in lowered else "internal"
    return {"code": code, "message": f"{stderr.strip() or 'failed'}: {path}"}
