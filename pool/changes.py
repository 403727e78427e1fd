"""What an episode changed in its sandbox's files, against the snapshot it started from.

An evaluator reading a 0 wants to know what the agent left behind: which files it
made, edited and deleted. Backends that can answer this without asking the
sandbox (``Capabilities.changes``) do: the local backend reads the sandbox's
writable overlay layer on the host, Docker asks the engine (``docker diff``). A
listing made by a command inside the sandbox would be the agent's to forge, so
backends without either say so instead of guessing.

Paths are absolute, as the sandbox sees them; a directory ends with ``/``. A new
directory is listed along with what is in it; a directory that only holds changes
is not itself a change. Lists are capped (``max_paths`` each); the counts are of
everything seen, and ``truncated`` says when a list, or the walk itself, stopped
short.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

MAX_PATHS = 500
"""The most paths kept per kind by default (added, changed, removed)."""
MAX_ENTRIES_WALKED = 200_000
"""Where a walk of the changes stops (an agent can make millions of files); counts are then lower bounds."""
KINDS = ("added", "changed", "removed")


@dataclass(frozen=True, slots=True)
class Changes:
    """The paths an episode added, changed (content or metadata) and removed."""

    source: str
    """Who listed them: "host" (the writable layer, read on the host) or "engine" (the container engine)."""
    added: tuple[str, ...] = ()
    changed: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    counts: dict[str, int] = field(default_factory=dict)
    """Per kind, how many were seen, kept or not."""
    truncated: bool = False
    """A list was cut at ``max_paths``, or the walk stopped at ``MAX_ENTRIES_WALKED``."""

    def without(self, paths: frozenset[str]) -> Changes:
        """These changes less ``paths`` (files the harness itself keeps in the sandbox), counts adjusted."""
        kept = {kind: tuple(p for p in getattr(self, kind) if p not in paths) for kind in KINDS}
        counts = {kind: self.counts.get(kind, 0) - (len(getattr(self, kind)) - len(kept[kind])) for kind in KINDS}
        return Changes(self.source, kept["added"], kept["changed"], kept["removed"], counts, self.truncated)

    def after(self, earlier: Changes) -> Changes:
        """The changes since ``earlier``'s start, when these were listed in a sandbox that started from
        the state ``earlier`` describes (an episode resumed at a checkpoint): paths made and then
        removed drop out, a path removed and made again is changed.

        The result is truncated when either listing was (the counts are then of the kept paths).
        """
        removed_dirs = tuple(p for p in self.removed if p.endswith("/"))

        def gone(path: str) -> bool:
            return path in self.removed or any(path.startswith(d) for d in removed_dirs)

        added = {p for p in earlier.added if not gone(p)}
        changed = {p for p in earlier.changed if not gone(p)}
        removed = {p for p in earlier.removed if p not in self.added}
        changed |= {p for p in self.added if p in earlier.removed}
        added |= {p for p in self.added if p not in earlier.removed}
        added |= {p for p in self.changed if p in earlier.added}
        changed |= {p for p in self.changed if p not in earlier.added}
        removed |= {p for p in self.removed if p not in earlier.added}
        lists = {"added": sorted(added), "changed": sorted(changed - added), "removed": sorted(removed)}
        truncated = self.truncated or earlier.truncated
        counts = {kind: len(paths) for kind, paths in lists.items()}
        return Changes(self.source, tuple(lists["added"]), tuple(lists["changed"]), tuple(lists["removed"]), counts,
                       truncated)  # fmt: skip

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Changes:
        """Read :meth:`as_dict` output back."""
        return cls(
            source=str(data.get("source", "host")),
            added=tuple(data.get("added") or ()),
            changed=tuple(data.get("changed") or ()),
            removed=tuple(data.get("removed") or ()),
            counts={kind: int((data.get("counts") or {}).get(kind, 0)) for kind in KINDS},
            truncated=bool(data.get("truncated")),
        )

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: the lists, the counts and whether anything was left out."""
        return {
            "source": self.source,
            "added": list(self.added),
            "changed": list(self.changed),
            "removed": list(self.removed),
            "counts": {kind: self.counts.get(kind, 0) for kind in KINDS},
            "truncated": self.truncated,
        }


class ChangeList:
    """Collects paths by kind up to a cap, counting all of them."""

    def __init__(self, source: str, *, max_paths: int = MAX_PATHS) -> None:
        self._source = source
        self._max_paths = max_paths
        self._paths: dict[str, list[str]] = {kind: [] for kind in KINDS}
        self._counts = dict.fromkeys(KINDS, 0)
        self._truncated = False

    def add(self, kind: str, path: str) -> None:
        """Record ``path`` as ``kind`` ("added", "changed" or "removed")."""
        self._counts[kind] += 1
        if len(self._paths[kind]) < self._max_paths:
            self._paths[kind].append(path)
        else:
            self._truncated = True

    def stop_early(self) -> None:
        """Say that the listing stopped before it saw everything."""
        self._truncated = True

    def result(self) -> Changes:
        """The collected changes, each list sorted."""
        return Changes(
            source=self._source,
            added=tuple(sorted(self._paths["added"])),
            changed=tuple(sorted(self._paths["changed"])),
            removed=tuple(sorted(self._paths["removed"])),
            counts=dict(self._counts),
            truncated=self._truncated,
        )
