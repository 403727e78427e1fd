"""Which of the paths an agent added a ``toolchain`` verifier gets (see :mod:`pool.verification`).

A real task's solution often installs what its code needs (``pip install``, ``apt-get
install``, ``npm install -g``) outside the task's outputs. A ``toolchain`` verifier runs on a
fresh sandbox at the known-good snapshot, as a strict one does, and gets, on top of it, the
paths the agent **added** under the install roots, as the backend listed them (never a list the
agent could edit), less what would hand the verifier's own tools to the agent. Each rule below
names why a path is dropped; the backend copies the rest:

- a path the known-good snapshot has (changed or replaced, or not) is the snapshot's;
- start-up hooks: ``*.pth``, ``sitecustomize``, ``usercustomize``;
- a new top-level Python module or package (in a site directory or a standard-library
  directory) whose name the known-good interpreters import already, a standard-library name,
  or the verifier's own tools (``pytest``, ``pluggy``, ``pip``, ``uv``...);
- every file of a distribution with a ``pytest11`` entry point, and of one the snapshot has
  (an upgrade: mixing versions would test neither);
- in a global ``node_modules``, new files of a package the snapshot has;
- in the bin folders and the known-good ``PATH``'s, a new command whose name that ``PATH`` resolves already;
- a shared library whose file name a known-good library folder has;
- under ``/etc``, anything but the files of a new folder of a package's own, and never the
  loader's, shells' or package tools' configuration folders;
- a symbolic link whose target leads outside the install roots.
"""

from __future__ import annotations

import configparser
import posixpath
import re
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

INSTALL_ROOTS = (
    "/usr/lib", "/usr/lib64", "/usr/local/lib", "/usr/share", "/usr/local/share", "/usr/include",
    "/usr/local/include", "/opt", "/usr/local/bin", "/usr/local/sbin", "/usr/bin", "/usr/sbin", "/bin", "/sbin",
    "/lib", "/lib64", "/etc",
)  # fmt: skip
"""Where installed files go: the only places a ``toolchain`` verifier takes added paths from."""
LINK_ROOTS = tuple(root for root in INSTALL_ROOTS if root != "/etc")
"""Where a grafted link may lead (``/etc`` is the snapshot's: ``/etc/shadow``, the loader's configuration)."""
BIN_DIRS = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")
"""The known-good ``PATH``'s folders, as the images' ``PATH`` lists them."""
LIB_DIRS = ("/lib", "/lib64", "/usr/lib", "/usr/lib64", "/usr/local/lib", "/lib/x86_64-linux-gnu",
            "/usr/lib/x86_64-linux-gnu", "/lib/aarch64-linux-gnu", "/usr/lib/aarch64-linux-gnu")  # fmt: skip
"""Folders whose libraries the loader finds; a new library of the same file name could replace one."""
TOOLCHAIN_MODULES = frozenset({
    "pytest", "_pytest", "py", "pluggy", "iniconfig", "pip", "setuptools", "_distutils_hack", "pkg_resources",
    "wheel", "uv", "packaging", "tomli", "exceptiongroup", "coverage",
})  # fmt: skip
"""Python names the verifier's own tools import; ``pytest_*`` too (a verifier's ``pip install pytest``
finds the agent's copy installed and keeps it)."""
ETC_NEVER = re.compile(
    r"^(ld\.so.*|profile.*|bash.*|environment.*|pip.*|python.*|xdg|uv|apt|ssl|ca-certificates"
    r"|alternatives|security|pam\.d|sudoers.*|npm.*|gitconfig|git|systemd|default|skel|snapgym)$"
)
"""``/etc`` folders whose content configures the loader, shells or the verifier's tools: never grafted."""
_SITE = ("site-packages", "dist-packages")
_STDLIB = re.compile(r"^/(usr/|usr/local/)?lib(64)?/python3(\.\d+)?$")
_MODULE_SUFFIX = re.compile(r"(\.cpython-[^.]*|\.abi3)?\.(py|pyc|pyi|so|pyd)$")
KEPT = "the known-good snapshot has this path: its version is kept"
MAX_LISTED = 500
"""The most paths :class:`InstallDelta` lists per kind (the counts are of all)."""


class KnownGood(Protocol):
    """The known-good snapshot's files, read by the backend where the agent cannot change them."""

    def kind(self, path: str) -> str | None:
        """``"dir"``, ``"file"`` or ``"link"`` at ``path`` (links before the last part followed in the
        image), None when the snapshot has nothing there."""
        ...

    def names(self, path: str) -> frozenset[str]:
        """The names in the folder at ``path`` (empty when there is none)."""
        ...


class AgentFiles(Protocol):
    """The agent's end state, read by the backend without following a link the agent made."""

    def read(self, path: str) -> bytes | None:
        """A small regular file's bytes (None: not a regular file)."""
        ...

    def readlink(self, path: str) -> str | None:
        """A symbolic link's target (None: not a link)."""
        ...

    def is_plain(self, path: str) -> bool:
        """Whether the path is a regular file, a folder or a link (not a FIFO, socket or device)."""
        ...


@dataclass(frozen=True, slots=True)
class InstallDelta:
    """What a ``toolchain`` verifier got of the agent's installs, and what it did not, with why."""

    grafted: tuple[str, ...] = ()
    """Added paths shown to the verifier (files and links; their new folders come with them)."""
    dropped: tuple[tuple[str, str], ...] = ()
    """(path, rule) for what was left out; a folder or distribution stands for everything in it."""
    counts: Mapping[str, int] | None = None
    """How many were grafted and dropped, listed or not."""
    truncated: bool = False
    """The listing of the agent's changes stopped short: some added paths were not considered."""

    def as_info(self) -> dict[str, Any]:
        """JSON-ready, for ``info["verifier"]["install_delta"]``."""
        return {
            "grafted": list(self.grafted[:MAX_LISTED]),
            "dropped": [{"path": path, "rule": rule} for path, rule in self.dropped[:MAX_LISTED]],
            "counts": dict(self.counts or {"grafted": len(self.grafted), "dropped": len(self.dropped)}),
            "truncated": self.truncated,
        }


def select(
    added: Iterable[str],
    known_good: KnownGood,
    agent: AgentFiles,
    *,
    changed: Iterable[str] = (),
    path: str = "",
    truncated: bool = False,
) -> InstallDelta:
    """The install delta of the ``added`` paths (absolute; a folder ends with ``/``), by the rules above.

    ``changed`` (paths the snapshot has that the agent changed or replaced) are listed as dropped.

    ``path``: the known-good ``PATH`` (its folders are bin folders, with :data:`BIN_DIRS`).
    """
    paths = sorted({p.rstrip("/") for p in added if _under(p.rstrip("/"), INSTALL_ROOTS)})
    bin_dirs = tuple(dict.fromkeys([*(d.rstrip("/") for d in path.split(":") if d.startswith("/")), *BIN_DIRS]))
    judge = _Judge(known_good, agent, frozenset(paths), bin_dirs)
    grafted: list[str] = []
    dropped: dict[str, str] = {}
    gone: set[str] = set()  # dropped folders: everything under them goes with them
    for edited in changed:
        if not edited.endswith("/") and _under(edited, INSTALL_ROOTS):
            dropped[edited] = KEPT
    for path in paths:
        is_folder = path in judge.folders
        if any(parent in gone for parent in _parents(path)):
            gone.add(path)
            continue
        if known_good.kind(path) is not None:
            if not is_folder:
                dropped[path] = KEPT
            continue
        why = judge.rule(path)
        if why is None:
            if not is_folder:
                grafted.append(path)
            continue
        gone.add(path)
        dropped.setdefault(_unit(path, why), why[1])
    listed = sorted(dropped.items())
    return InstallDelta(tuple(grafted), tuple(listed), {"grafted": len(grafted), "dropped": len(listed)}, truncated)


def _parents(path: str) -> Iterable[str]:
    while (path := posixpath.dirname(path)) != "/":
        yield path


def _under(path: str, roots: Iterable[str]) -> bool:
    return any(path == root or path.startswith(root + "/") for root in roots)


def _unit(path: str, why: tuple[str, str]) -> str:
    """The path a drop is listed under: the folder or distribution the rule is about, or the path."""
    return why[0] if path.startswith(why[0] + "/") or path == why[0] else path


def module_name(entry: str) -> str:
    """The import name of a site directory's entry (``numpy``, ``six.py``, ``_c.cpython-311-x86_64-linux-gnu.so``)."""
    return _MODULE_SUFFIX.sub("", entry)


def dist_name(entry: str) -> str:
    """The normalised distribution name of a ``*.dist-info`` or ``*.egg-info`` entry."""
    stem = entry.rsplit(".", 1)[0]
    name = stem.split("-", 1)[0]
    return re.sub(r"[-_.]+", "_", name).lower()


class _Judge:
    """The rules, with what they learn of the snapshot and the agent's distributions kept."""

    def __init__(
        self, known_good: KnownGood, agent: AgentFiles, added: frozenset[str], bin_dirs: tuple[str, ...]
    ) -> None:
        self.bin_dirs = bin_dirs
        self.kg = known_good
        self.agent = agent
        self.added = added
        self.folders = {posixpath.dirname(p) for p in added}
        self.stdlib = frozenset(sys.stdlib_module_names)
        self._names: dict[str, frozenset[str]] = {}
        self._dists: dict[str, dict[str, tuple[str, str]]] = {}

    def rule(self, path: str) -> tuple[str, str] | None:
        """(the folder or path the rule is about, why) when ``path`` is dropped, else None."""
        name = posixpath.basename(path)
        if not self.agent.is_plain(path):
            return path, "not a regular file, folder or link"
        if name.endswith(".pth"):
            return path, "a start-up hook (*.pth) that every Python would run"
        if module_name(name) in ("sitecustomize", "usercustomize"):
            return path, "a start-up hook (sitecustomize/usercustomize) that every Python would run"
        target = self.agent.readlink(path)
        if target is not None and not _under(_resolved(path, target), LINK_ROOTS):
            return path, f"a link that leads outside the install roots (-> {target}): not followed, not grafted"
        for check in (self._python, self._node, self._bin, self._lib, self._etc):
            if (why := check(path)) is not None:
                return why
        return None

    def _names_of(self, folder: str) -> frozenset[str]:
        if folder not in self._names:
            self._names[folder] = self.kg.names(folder)
        return self._names[folder]

    def _python(self, path: str) -> tuple[str, str] | None:
        parts = path.split("/")
        site = next((i for i, part in enumerate(parts) if part in _SITE), None)
        if site is not None:
            folder = "/".join(parts[: site + 1])
        else:
            folder = next(("/".join(parts[:i]) for i in range(3, len(parts)) if _STDLIB.match("/".join(parts[:i]))), "")
            if not folder:
                return None
        rest = path[len(folder) + 1 :].split("/")
        top = rest[0]
        unit = f"{folder}/{top}"
        if top.endswith((".dist-info", ".egg-info")):
            return self._dist(folder, top)
        name = module_name(top)
        owner = self._dists_of(folder).get(name)
        if owner is not None:
            return unit, owner[1]
        if name == "__pycache__" or top.endswith((".data",)):
            return None
        if name in TOOLCHAIN_MODULES or name.startswith("pytest_"):
            return unit, f"shadows the verifier's own tool {name!r} (a verifier's install would keep it)"
        if name in self.stdlib:
            return unit, f"shadows the standard-library module {name!r}"
        if name in self._importable(folder):
            return unit, f"shadows {name!r}, which the known-good interpreters import already"
        return None

    def _importable(self, folder: str) -> frozenset[str]:
        """Module names in the snapshot's Python folders (this one, its standard library's, the usual site dirs)."""
        folders = {folder, "/usr/lib/python3/dist-packages"}
        for lib in ("/usr/lib", "/usr/local/lib", posixpath.dirname(posixpath.dirname(folder))):
            for entry in self._names_of(lib):
                if entry.startswith("python3"):
                    folders |= {f"{lib}/{entry}", f"{lib}/{entry}/site-packages", f"{lib}/{entry}/dist-packages",
                                f"{lib}/{entry}/lib-dynload"}  # fmt: skip
        return frozenset(module_name(entry) for f in folders for entry in self._names_of(f))

    def _dists_of(self, folder: str) -> dict[str, tuple[str, str]]:
        """Module name -> (unit, why) for the files of the agent's dropped distributions in ``folder``."""
        if folder not in self._dists:
            owned: dict[str, tuple[str, str]] = {}
            tops = {p[len(folder) + 1 :].split("/")[0] for p in self.added if p.startswith(folder + "/")}
            for entry in sorted(t for t in tops if t.endswith((".dist-info", ".egg-info"))):
                why = self._dist_rule(folder, entry)
                if why is not None:
                    owned.update(dict.fromkeys(self._modules_of(folder, entry), (f"{folder}/{entry}", why)))
            self._dists[folder] = owned
        return self._dists[folder]

    def _dist(self, folder: str, entry: str) -> tuple[str, str] | None:
        why = self._dist_rule(folder, entry)
        return None if why is None else (f"{folder}/{entry}", why)

    def _dist_rule(self, folder: str, entry: str) -> str | None:
        name = dist_name(entry)
        had = [e for e in self._names_of(folder) if e.endswith((".dist-info", ".egg-info")) and dist_name(e) == name]
        if had:
            return f"an upgrade of the distribution {name!r}, which the snapshot has ({had[0]}): all its files dropped"
        groups = _entry_points(self.agent.read(f"{folder}/{entry}/entry_points.txt"))
        if "pytest11" in groups:
            return f"the distribution {name!r} is a pytest plugin (pytest11 entry point): all its files dropped"
        if name in TOOLCHAIN_MODULES or name.startswith("pytest_"):
            return f"the distribution {name!r} is one of the verifier's own tools"
        return None

    def _modules_of(self, folder: str, entry: str) -> set[str]:
        """Top-level names a distribution installs: its RECORD's and its entry points' modules."""
        names = set()
        record = self.agent.read(f"{folder}/{entry}/RECORD") or b""
        for line in record.decode(errors="replace").splitlines():
            rel = posixpath.normpath(line.split(",", 1)[0])
            if rel and not rel.startswith(".."):
                names.add(module_name(rel.split("/")[0]))
        top = self.agent.read(f"{folder}/{entry}/top_level.txt") or b""
        names |= {n.strip() for n in top.decode(errors="replace").splitlines() if n.strip()}
        for targets in _entry_points(self.agent.read(f"{folder}/{entry}/entry_points.txt")).values():
            names |= {t.split(":", 1)[0].split(".", 1)[0].strip() for t in targets}
        return names - {"", "__pycache__"}

    def _node(self, path: str) -> tuple[str, str] | None:
        marker = "/node_modules/"
        if marker not in path:
            return None
        folder, rest = path.split(marker, 1)
        parts = rest.split("/")
        top = "/".join(parts[:2]) if parts[0].startswith("@") else parts[0]
        unit = f"{folder}/node_modules/{top}"
        if unit != path and self.kg.kind(unit) is not None:
            return unit, "changes a package the snapshot's node_modules has"
        return None

    def _bin(self, path: str) -> tuple[str, str] | None:
        folder, name = posixpath.split(path)
        if folder not in self.bin_dirs:
            return None
        if any(name in self._names_of(d) for d in self.bin_dirs):
            return path, f"shadows the known-good command {name!r} on PATH"
        return None

    def _lib(self, path: str) -> tuple[str, str] | None:
        folder, name = posixpath.split(path)
        if ".so" not in name or folder not in LIB_DIRS:
            return None
        if any(name in self._names_of(d) for d in LIB_DIRS):
            return path, f"shadows the known-good library {name!r}"
        return None

    def _etc(self, path: str) -> tuple[str, str] | None:
        if not path.startswith("/etc/"):
            return None
        parts = path.split("/")
        top = "/".join(parts[:3])
        if len(parts) == 3 and path not in self.folders:
            return path, "/etc: only a new folder of a package's own is grafted"
        if ETC_NEVER.match(parts[2]):
            return top, "/etc: configuration of the loader, shells or the verifier's tools"
        if self.kg.kind(top) is not None:
            return path, f"/etc: {top} is the snapshot's (only a new folder of a package's own is grafted)"
        return None


def _resolved(link: str, target: str) -> str:
    """Where a link's target points, lexically (``..`` never climbs above the root)."""
    joined = target if target.startswith("/") else posixpath.join(posixpath.dirname(link), target)
    return "/" + posixpath.normpath("/" + joined).lstrip("/")


def _entry_points(data: bytes | None) -> dict[str, list[str]]:
    if not data:
        return {}
    parser = configparser.ConfigParser(interpolation=None, delimiters=("=",))
    try:
        parser.read_string(data.decode(errors="replace"))
    except configparser.Error:
        return {"pytest11": []}  # unreadable: treated as a plugin, whose files are dropped
    return {group: list(parser[group].values()) for group in parser.sections()}
