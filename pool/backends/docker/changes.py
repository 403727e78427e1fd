"""A Docker sandbox's changes, as the engine lists them (``docker diff``): nothing runs in the container.

The engine reports every folder on the way to a change as changed itself; those
are dropped (a folder is listed as changed only when nothing below it is), and
an added path with added paths below it is shown as a folder (``/`` at the end); the
engine does not say which paths are folders, so an empty new folder shows as a file would.
"""

from __future__ import annotations

from typing import Any

from pool.backends.docker.transport.engine import translate
from pool.changes import MAX_PATHS, ChangeList, Changes
from pool.errors import SandboxCrashedError

_KINDS = {0: "changed", 1: "added", 2: "removed"}


def read_changes(api: Any, container: str, *, max_paths: int = MAX_PATHS) -> Changes:
    """The paths added, changed and removed in ``container`` since it started from its image.

    Raises:
        SandboxCrashedError: the container is gone. BackendError: the engine refused.
    """
    try:
        entries = api.diff(container) or []
    except Exception as exc:
        gone = f"container {container[:12]} is gone"
        raise translate(
            exc, f"listing the changes of {container[:12]}", missing=lambda why: SandboxCrashedError(f"{gone} ({why})")
        ) from None
    paths = sorted((str(entry["Path"]), _KINDS.get(int(entry["Kind"]), "changed")) for entry in entries)
    found = ChangeList("engine", max_paths=max_paths)
    for index, (path, kind) in enumerate(paths):
        has_below = index + 1 < len(paths) and paths[index + 1][0].startswith(path.rstrip("/") + "/")
        if kind == "changed" and has_below:
            continue
        found.add(kind, path + "/" if has_below and not path.endswith("/") else path)
    return found.result()
