"""Protected test infrastructure: files in the task's outputs that the verifier takes from the
known-good snapshot, never from the agent.

The tests read the outputs, and a test harness reads more of them than the answer: pytest loads
every ``conftest.py`` from the rootdir down (a 10-line ``pytest_runtest_makereport`` hook marks
every test passed: the exploit that scores SWE-bench-shaped tasks without solving one), takes
options from ``pytest.ini``, ``tox.ini``, ``setup.cfg`` and ``pyproject.toml`` (``addopts = -p
plugin``), imports a ``pytest`` or ``_pytest`` package found first on ``sys.path``, and Python runs
``sitecustomize.py``, ``usercustomize.py`` and ``.pth`` files of its path at start-up and trusts
a ``__pycache__`` it finds (an unchecked-hash ``.pyc`` is never compared with its source).

So before the tests run, the outputs are cleaned of these, at any depth (patterns are globs on
the name):

- :data:`DEFAULT_PROTECTED` (or the task's ``[snapgym] protected``): made what the known-good
  snapshot holds there: what the agent added is removed, what it changed or removed is put back.
  ``pyproject.toml``, ``setup.cfg`` and ``tox.ini`` are project files an agent may have to edit:
  they count as changed only when their pytest section differs (then the known-good file is put
  back), and one the agent added counts only if it has a pytest section.
- :data:`ADDED_ONLY`: packages that would shadow the test runner and the interpreter's start-up
  hooks are removed when the agent added them; the project's own (the pytest repository's
  ``src/_pytest``, which a fix may have to change) are the agent's to change.
- :data:`CACHES`: ``__pycache__`` folders are removed (the interpreter remakes them).

What was done is in ``info["verifier"]["protected"]``. A task that declares ``[snapgym] protected``
gets exactly its patterns (restored as above; ``[]``: nothing is protected).

The known-good side is read once per task snapshot from a fresh sandbox of it (:func:`known_good`);
the agent's side is listed in the verifier's view with ``find``, which in strict mode is the
known-good snapshot's own program, or, where the backend can (the local one, strict: see
``pool.contract.ListsVerifierView``), by the host walking the same view without a process in the
sandbox. In shared mode the agent's programs are the verifier's by design
(see ``envs.tasks.verifier``); the protection there is best effort.
"""

from __future__ import annotations

import configparser
import contextlib
import hashlib
import shlex
import threading
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from fnmatch import fnmatchcase

from envs.tasks.task import Task
from pool.contract import ListsVerifierView, Sandbox
from pool.errors import FileOperationError, SandboxError, SnapgymError
from pool.snapshots import Snapshot

DEFAULT_PROTECTED = (
    "conftest.py", "pytest.ini", ".pytest.ini", "pytest.toml", ".pytest.toml", "tox.ini", "setup.cfg", "pyproject.toml",
)  # fmt: skip
"""pytest's plugins and configuration: the known-good snapshot's, always."""

ADDED_ONLY = ("pytest", "_pytest", "pytest.py", "pluggy", "py.py", "sitecustomize.py", "usercustomize.py", "*.pth")
"""Shadowing packages and start-up hooks: removed when the agent added them."""

SECTIONED = {"pyproject.toml": ("tool.pytest", "tool.pytest.ini_options"), "setup.cfg": ("tool:pytest",),
             "tox.ini": ("pytest",)}  # fmt: skip
"""Project files protected only in their pytest sections (the file is put back when those differ)."""

CACHES = ("__pycache__",)
"""Folders removed wherever they are (no known-good copy is put back: the interpreter remakes them)."""


@dataclass(frozen=True, slots=True)
class Entry:
    """One protected file or folder entry as a snapshot holds it."""

    kind: str
    """``f`` a file, ``d`` a folder, ``l`` a symbolic link."""
    mode: int
    data: bytes = b""
    """A file's bytes, or a link's target."""


@dataclass(frozen=True, slots=True)
class KnownGood:
    """The protected entries of one snapshot's outputs, by absolute path (folders with their contents)."""

    patterns: tuple[str, ...]
    """The patterns restored to these entries (the defaults or the task's)."""
    added_only: tuple[str, ...] = ()
    entries: dict[str, Entry] = field(default_factory=dict)

    @property
    def everything(self) -> tuple[str, ...]:
        """Every pattern looked for."""
        return (*self.patterns, *self.added_only, *(CACHES if self.patterns or self.added_only else ()))


@dataclass(frozen=True, slots=True)
class Protection:
    """What was done to the verifier's view."""

    removed: tuple[str, ...] = ()
    """Entries the agent added (or caches), removed."""
    restored: tuple[str, ...] = ()
    """Entries the agent changed or removed, put back as the known-good snapshot had them."""

    def as_info(self) -> dict[str, list[str]]:
        """JSON-ready fields for ``info["verifier"]["protected"]``."""
        return {"removed": list(self.removed), "restored": list(self.restored)}


def known_good(sandbox: Sandbox, outputs: tuple[str, ...], patterns: tuple[str, ...] | None) -> KnownGood:
    """The protected entries of ``outputs`` in ``sandbox``, which must be a fresh sandbox of the
    task's known-good snapshot (nothing of an agent's in it). ``patterns``: the task's (None: the
    defaults, with :data:`ADDED_ONLY` and :data:`CACHES`)."""
    found = KnownGood(DEFAULT_PROTECTED, ADDED_ONLY) if patterns is None else KnownGood(tuple(patterns))
    if not found.everything:
        return found
    for path, (kind, mode) in _listing(sandbox, outputs, found.everything, inside=True).items():
        if any(part in CACHES for part in path.split("/")):
            continue
        data = b""
        if kind == "f":
            data = sandbox.read_file(path)
        elif kind == "l":
            data = sandbox.exec(f"readlink -- {shlex.quote(path)}", timeout_s=60).stdout.rstrip("\n").encode()
        found.entries[path] = Entry(kind, mode, data)
    return found


def protect(sandbox: Sandbox, outputs: tuple[str, ...], good: KnownGood) -> Protection:
    """Make the protected entries of the verifier's view of ``outputs`` the known-good ones."""
    if not good.everything:
        return Protection()
    seen = _listing(sandbox, outputs, good.everything, inside=False)
    removed, restored = [], []
    for path, (kind, _) in sorted(seen.items()):
        name = path.rsplit("/", 1)[-1]
        if name in CACHES:
            removed.append(path)
        elif path not in good.entries:
            if _undecodable(path) or not (
                kind == "f" and name in SECTIONED and _pytest_part(name, _read(sandbox, path)) == _NO_PYTEST
            ):
                removed.append(path)  # a name that is not UTF-8 is not read: not every backend could
        elif _matches(name, good.patterns) and not _same(sandbox, path, kind, good):
            restored.append(path)
    for path in sorted(set(good.entries) - set(seen)):  # removed by the agent: put back (top entries only)
        top = not any(path.startswith(other + "/") for other in good.entries if other != path)
        if top and _matches(path.rsplit("/", 1)[-1], good.patterns):
            restored.append(path)
    _remove(sandbox, [p for p in (*removed, *restored) if p in seen])
    for path in restored:
        _put_back(sandbox, path, good)
    return Protection(tuple(removed), tuple(restored))


_NO_PYTEST: object = object()
"""What :func:`_pytest_part` gives for a project file without a pytest section."""


def _matches(name: str, patterns: tuple[str, ...]) -> bool:
    return any(fnmatchcase(name, pattern) for pattern in patterns)


def _read(sandbox: Sandbox, path: str) -> bytes:
    try:
        return sandbox.read_file(path)
    except FileOperationError:
        return b""


def _same(sandbox: Sandbox, path: str, kind: str, good: KnownGood) -> bool:
    """Whether the agent's entry at ``path`` is the known-good one (for sectioned files: its pytest part)."""
    entry = good.entries[path]
    if kind != entry.kind:
        return False
    if kind == "d":
        inside = _listing(sandbox, (path,), ("*",), inside=True)
        want = {p for p in good.entries if p.startswith(path + "/")}
        return set(inside) - {path} == want and all(_same(sandbox, p, k, good) for p, (k, _) in inside.items()
                                                    if p != path)  # fmt: skip
    data = _read(sandbox, path) if kind == "f" else b""
    if kind == "l":
        data = sandbox.exec(f"readlink -- {shlex.quote(path)}", timeout_s=60).stdout.rstrip("\n").encode()
    name = path.rsplit("/", 1)[-1]
    if kind == "f" and name in SECTIONED:
        return _pytest_part(name, data) == _pytest_part(name, entry.data)
    return hashlib.sha256(data).digest() == hashlib.sha256(entry.data).digest()


def _pytest_part(name: str, data: bytes) -> object:
    """The pytest sections of a project file (a file that does not parse: its bytes, so it differs)."""
    sections = SECTIONED[name]
    try:
        if name.endswith(".toml"):
            table = tomllib.loads(data.decode())
            found: dict[str, object] = {}
            for dotted in sections:
                value: object = table
                for key in dotted.split("."):
                    value = value.get(key) if isinstance(value, dict) else None
                found[dotted] = value
        parser = configparser.RawConfigParser()
        parser.read_string(data.decode())
        found = {s: dict(parser.items(s)) if parser.has_section(s) else None for s in sections}
    except (UnicodeDecodeError, tomllib.TOMLDecodeError, configparser.Error):
        return data
    return _NO_PYTEST if all(value is None for value in found.values()) else found


def _put_back(sandbox: Sandbox, path: str, good: KnownGood) -> None:
    for each in sorted(p for p in good.entries if p == path or p.startswith(path + "/")):
        entry = good.entries[each]
        quoted = shlex.quote(each)
        if entry.kind == "d":
            sandbox.exec(f"mkdir -p -- {quoted} && chmod {entry.mode:o} -- {quoted}", timeout_s=60, cwd="/")
        elif entry.kind == "l":
            sandbox.exec(f"ln -sfn -- {shlex.quote(entry.data.decode())} {quoted}", timeout_s=60, cwd="/")
        else:
            sandbox.write_file(each, entry.data, mode=entry.mode)


def _listing(sandbox: Sandbox, outputs: tuple[str, ...], patterns: tuple[str, ...], *,
             inside: bool) -> dict[str, tuple[str, int]]:  # fmt: skip
    """Entries of ``outputs`` whose name matches a pattern, ``path -> (kind, mode)``; with ``inside``,
    also everything inside a matched folder. Links are not followed. Without ``inside``, a sandbox that
    can list its strict verifier's view from the host does (no ``find`` started in it)."""
    if not inside and isinstance(sandbox, ListsVerifierView):
        listed_on_host = sandbox.list_verifier_view(outputs, patterns)
        if listed_on_host is not None:
            return listed_on_host
    return find_listing(sandbox, outputs, patterns, inside=inside)


def find_listing(sandbox: Sandbox, outputs: tuple[str, ...], patterns: tuple[str, ...], *,
                 inside: bool) -> dict[str, tuple[str, int]]:  # fmt: skip
    """:func:`_listing` by ``find`` in the sandbox (what a sandbox that cannot list from the host runs).

    ``find``'s records come back hex-encoded (``od``), so a name that is not UTF-8 keeps its bytes
    (as ``surrogateescape`` text) instead of being decoded with replacement into a path that names
    nothing: the protection can then remove it (see :func:`_remove`).
    """
    names = " -o ".join(f"-name {shlex.quote(p)}" for p in patterns)
    roots = " ".join(shlex.quote(o) for o in outputs)
    found = _find_records(sandbox, f"find {roots} -mindepth 1 \\( {names} \\) {'' if inside else '-prune'}")
    if inside:  # a matched folder's contents, whatever their names
        for folder in [p for p, (k, _) in found.items() if k == "d"]:
            if any(fnmatchcase(folder.rsplit("/", 1)[-1], c) for c in CACHES):
                continue
            assignments, (word,) = _spelled([folder])
            found.update(_find_records(sandbox, f"find {word} -mindepth 1", before=assignments))
    return found


_NO_OD = 86
"""The exit status of a listing in a sandbox without ``od`` (then the records come back raw)."""


def _find_records(sandbox: Sandbox, find: str, *, before: str = "") -> dict[str, tuple[str, int]]:
    """``path -> (kind, mode)`` of what ``find`` (without its action; ``before``: assignments it needs) prints,
    names kept byte for byte.

    Raises:
        SandboxError: the sandbox has no ``od`` and a listed name is not UTF-8 (it could not be removed).
    """
    listed = sandbox.exec(
        f"command -v od >/dev/null 2>&1 || exit {_NO_OD}; {before}{find} -printf '%y %m %p\\0' 2>/dev/null | "
        "od -An -v -tx1",
        timeout_s=300, cwd="/", max_output_bytes=64 << 20,
    )  # fmt: skip
    if listed.exit_code == _NO_OD:
        raw = sandbox.exec(f"{before}{find} -printf '%y %m %p\\0' 2>/dev/null; true", timeout_s=300, cwd="/",
                           max_output_bytes=16 << 20).stdout.encode("utf-8", "surrogateescape")  # fmt: skip
        if "\ufffd".encode() in raw:
            raise SandboxError(
                "a file name under the task's outputs is not UTF-8 and this sandbox has no `od` to list it byte "
                "for byte, so the protection could not remove it; install coreutils in the task's image"
            )
    else:
        hexed = "".join(listed.stdout.split())
        raw = bytes.fromhex(hexed[: len(hexed) // 2 * 2])  # a listing cut at the cap: its whole bytes
    found: dict[str, tuple[str, int]] = {}
    for record in raw.split(b"\0"):
        kind, _, rest = record.partition(b" ")
        mode, _, path = rest.partition(b" ")
        if kind in (b"f", b"d", b"l") and mode.isdigit() and path.startswith(b"/"):
            found[path.decode("utf-8", "surrogateescape")] = (kind.decode(), int(mode, 8))
    return found


def _spelled(paths: list[str]) -> tuple[str, list[str]]:
    """``paths`` as shell words of plain ASCII, whatever their bytes, and the assignments they need first.

    A name that is not UTF-8 cannot travel as text to every backend, so it is spelled with ``printf``
    octal escapes into a variable (an ``x`` after it keeps a trailing newline from the command
    substitution, and ``${var%x}`` takes it off again).
    """
    assignments, words = [], []
    for index, path in enumerate(paths):
        raw = path.encode("utf-8", "surrogateescape")
        if raw.isascii():
            words.append(shlex.quote(path))
            continue
        octal = "".join(f"\\{byte:03o}" for byte in raw)
        assignments.append(f"p{index}=$(printf '{octal}x'); ")
        words.append(f'"${{p{index}%x}}"')
    return "".join(assignments), words


def _remove(sandbox: Sandbox, paths: list[str]) -> None:
    """``rm -rf`` each of ``paths`` in the sandbox (names that are not UTF-8 included)."""
    if paths:
        assignments, words = _spelled(paths)
        sandbox.exec(f"{assignments}rm -rf -- {' '.join(words)}", timeout_s=120, cwd="/")


def _undecodable(path: str) -> bool:
    """The path holds bytes that are not UTF-8 (kept as surrogates)."""
    return any("\udc80" <= ch <= "\udcff" for ch in path)


_READ: dict[tuple[str, str, tuple[str, ...], tuple[str, ...] | None], KnownGood] = {}
_READ_LOCK = threading.Lock()
_MAX_READ = 512


def known_good_of(task: Task, snapshot: Snapshot, fresh: Callable[[], Sandbox]) -> KnownGood | None:
    """The known-good test infrastructure of ``task`` at ``snapshot``, read once per process from
    ``fresh()`` (a new sandbox of it, closed afterwards; a snapshot's digest names its content, so
    every environment of the process shares what was read). None: the task has no outputs."""
    if not task.outputs:
        return None
    key = (task.id, snapshot.digest, task.outputs, task.settings.protected)
    with _READ_LOCK:
        found = _READ.get(key)
    if found is None:
        sandbox = fresh()
        try:
            found = known_good(sandbox, task.outputs, task.settings.protected)
        finally:
            with contextlib.suppress(SnapgymError):
                sandbox.close()
        with _READ_LOCK:
            if len(_READ) >= _MAX_READ:
                _READ.clear()
            _READ[key] = found
    return found
