"""The house keeps its shape: wings import only downwards, no import circle, small modules.

Read from the source with :mod:`ast` (nothing is imported), so a test fails on the commit that breaks
a rule, naming the modules. Imports under ``if TYPE_CHECKING:`` count: a circle that only the type
checker sees is still two modules that each need the other to be understood.
"""

from __future__ import annotations

import ast
from collections import Counter
from functools import cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("pool", "envs", "benchmarks")
DATA_FOLDERS = ("envs/builtin/", "benchmarks/tasks/", "benchmarks/attacks/targets/")
"""Task directories shipped inside the packages: data, not modules of snapgym."""
MAX_MODULE_LINES = 500
MAX_FOLDER_MODULES = 12
"""Modules (``__init__.py`` counted) in any folder, the top of pool/ included: past a dozen, a folder splits into
sub-packages."""
MAX_FOLDER_C_FILES = 12
"""C files (``.c`` and ``.h``) in any folder of pool/: past a dozen, a folder splits into subfolders."""

WINGS: list[tuple[str, int]] = [
    ("pool.cluster", 4),
    ("pool.backends", 3),
    ("pool.build", 2),
    ("pool.egress", 1),
    ("pool.network", 0),
    ("pool", 0),
    ("envs", 5),
    ("benchmarks.agents", 6),
    ("benchmarks.episodes", 7),
    ("benchmarks.reports", 8),
    ("benchmarks.attacks", 8),
    ("benchmarks.scenarios", 9),
    ("benchmarks.viewer", 9),
    ("benchmarks", 10),
]
"""Each wing with its rank (longest prefix first): a module may import a wing of its own rank or lower.
``benchmarks`` at the top is the runner's face (run, cli, config, schemas, job, api, view)."""
SHARED_BY_BACKENDS = ("remote", "csrc", "features")
"""Modules and folders of pool/backends that are not backends: the cloud backends' base, the C they share,
the documentation's table of what every backend declares."""
FACE_ENTRY_POINTS = {"benchmarks.run", "benchmarks.cli", "benchmarks.api", "benchmarks.view", "benchmarks.multirun"}
"""The runner's entry points: nothing in benchmarks imports them but the face itself."""
FACE_VALUES = {"benchmarks.config", "benchmarks.schemas", "benchmarks.job"}
"""The face's values (the run's config and what a scenario gets): every wing of the runner may read them."""


def module_files() -> dict[str, Path]:
    """Every module of the three packages, by dotted name (a package by its own name)."""
    found = {}
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            relative = path.relative_to(REPO)
            if relative.as_posix().startswith(DATA_FOLDERS):
                continue
            parts = relative.with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


def _absolute(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


def _nearest(name: str, files: dict[str, Path]) -> str:
    while name and name not in files:
        name = name.rpartition(".")[0]
    return name


def imported_modules(path: Path, module: str, files: dict[str, Path]) -> set[str]:
    """The modules of the three packages that ``path`` (module ``module``) imports."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(_nearest(alias.name, files) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(node, module, path.name == "__init__.py")
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                found.add(submodule if submodule in files else _nearest(base, files))
    return found - {"", module}


@cache
def import_graph() -> dict[str, frozenset[str]]:
    """Module → the modules of the three packages it imports."""
    files = module_files()
    return {module: frozenset(imported_modules(path, module, files)) for module, path in files.items()}


def wing_of(module: str) -> tuple[str, int]:
    for prefix, rank in WINGS:
        if module == prefix or module.startswith(prefix + "."):
            return prefix, rank
    raise AssertionError(f"{module} belongs to no wing: add it to WINGS")


def is_package_face(module: str) -> bool:
    """A package's ``__init__`` re-exports its wing's public names; it is the door, not a room."""
    return (REPO / Path(*module.split(".")) / "__init__.py").exists()


def upward_imports() -> list[str]:
    found = []
    for module, targets in import_graph().items():
        if is_package_face(module):
            continue
        wing, rank = wing_of(module)
        for target in targets:
            target_wing, target_rank = wing_of(target)
            if target in FACE_VALUES:
                continue
            if target_rank > rank or (target in FACE_ENTRY_POINTS and module not in FACE_ENTRY_POINTS):
                found.append(f"{module} ({wing}) imports {target} ({target_wing})")
    return sorted(found)


def backend_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[:2] == ["pool", "backends"] else None


def cross_backend_imports() -> list[str]:
    found = []
    for module, targets in import_graph().items():
        own = backend_of(module)
        for target in targets:
            other = backend_of(target)
            if own and other and other not in (own, *SHARED_BY_BACKENDS):
                found.append(f"{module} imports {target}")
    return sorted(found)


def circles() -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    graph = import_graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_every_module_belongs_to_a_wing() -> None:
    for module in import_graph():
        wing_of(module)


def test_wings_import_only_downwards() -> None:
    assert upward_imports() == []


def test_pool_never_imports_envs_or_benchmarks_and_envs_never_imports_benchmarks() -> None:
    found = [
        f"{module} imports {target}"
        for module, targets in import_graph().items()
        for target in targets
        if (module.startswith("pool") and target.split(".")[0] in ("envs", "benchmarks"))
        or (module.startswith("envs") and target.split(".")[0] == "benchmarks")
    ]
    assert found == []


def test_a_backend_never_imports_another_backend() -> None:
    assert cross_backend_imports() == []


def test_there_is_no_import_circle() -> None:
    assert circles() == []


def test_no_module_is_over_500_lines() -> None:
    over = {
        module: n
        for module, path in module_files().items()
        if (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert over == {}


def test_no_c_file_of_pool_is_over_500_lines() -> None:
    """The daemon's and the Docker helper's C keep to the modules' limit: past it a file holds two ideas."""
    over = {
        path.relative_to(REPO).as_posix(): n
        for path in (REPO / "pool").rglob("*.[ch]")
        if (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert over == {}


def test_no_folder_holds_more_than_a_dozen_modules() -> None:
    folders = {path.parent for path in module_files().values()}
    over = {
        folder.relative_to(REPO).as_posix(): n
        for folder in folders
        if (n := len(list(folder.glob("*.py")))) > MAX_FOLDER_MODULES
    }
    assert over == {}


def c_folders_over(root: Path) -> dict[str, int]:
    """The folders under ``root`` that hold more than a dozen C files, with their counts."""
    counts = Counter(path.parent for path in root.rglob("*.[ch]"))
    return {folder.relative_to(root).as_posix(): n for folder, n in counts.items() if n > MAX_FOLDER_C_FILES}


def test_no_folder_of_pool_holds_more_than_a_dozen_c_files() -> None:
    assert c_folders_over(REPO / "pool") == {}


def test_the_c_count_sees_a_crowded_folder(tmp_path: Path) -> None:
    """Thirteen C files in one folder are reported; the same thirteen split over a subfolder are not."""
    names = [*(f"part{i}.c" for i in range(12)), "daemon.h"]
    crowded = [f"crowded/{name}" for name in names]
    split = [f"split/{'sub/' if i % 2 else ''}{name}" for i, name in enumerate(names)]
    for relative in [*crowded, *split, "crowded/README.md"]:
        path = tmp_path / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()
    assert c_folders_over(tmp_path) == {"crowded": 13}


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("import pool.errors\n", {"pool.errors"}),
        ("from pool.cluster import lease\n", {"pool.cluster.lease"}),
        (
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pool.contract import Sandbox\n",
            {"pool.contract"},
        ),
    ],
)
def test_the_graph_reads_every_kind_of_import(source: str, expected: set[str], tmp_path: Path) -> None:
    """The reader is not blind to a kind of import (a rule it cannot see would pass vacuously)."""
    path = tmp_path / "probe.py"
    path.write_text(source)
    assert imported_modules(path, "pool.probe", module_files()) == expected
