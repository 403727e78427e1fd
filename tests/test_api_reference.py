"""The API reference (docs/reference/) covers every public name, and our docstrings render as Markdown.

``mkdocs build --strict`` (in .ci/run) fails on a docstring griffe cannot parse; these tests catch what
it lets through: a name added to a package's ``__all__`` but not to its reference page, an entry that
renders a whole module where a function of the same name was meant (``envs.rollout``), and the
reStructuredText markup of our docstrings (roles, ``::`` blocks, ``>>>`` examples) reaching the page
raw. Read statically with griffe, as mkdocstrings does: nothing of snapgym is imported.
"""

from __future__ import annotations

import ast
import importlib.util
import re
from functools import cache
from pathlib import Path
from types import ModuleType

import pytest

from tests.support.needs import import_or_skip

import_or_skip("griffe", "griffe comes with the docs extra: pip install -e '.[docs]'")

import griffe  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
REFERENCE = REPO / "docs" / "reference"
PUBLIC = ("pool", "envs", "envs.aio", "benchmarks")
"""The packages whose ``__all__`` the reference documents."""
MODULE_ENTRIES = {"pool.errors"}
"""Entries meant to render a module's docstring (the error tree), not a function or class."""


@cache
def rst_markup() -> ModuleType:
    """docs/_ext/rst_markup.py, the griffe extension mkdocs.yml loads (not a package: loaded by path)."""
    spec = importlib.util.spec_from_file_location("rst_markup", REPO / "docs" / "_ext" / "rst_markup.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def exported(package: str) -> set[str]:
    """The names in ``package``'s ``__all__``, read from its ``__init__.py``."""
    tree = ast.parse((REPO / package.replace(".", "/") / "__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            return set(ast.literal_eval(node.value))
    raise AssertionError(f"{package} has no __all__")


def entries() -> list[str]:
    """Every ``::: target`` of the reference pages."""
    return [t for page in sorted(REFERENCE.glob("*.md")) for t in re.findall(r"^::: (\S+)", page.read_text(), re.M)]


@cache
def loaded() -> griffe.ModulesCollection:
    loader = griffe.GriffeLoader(
        search_paths=[str(REPO)], docstring_parser="google", extensions=griffe.load_extensions(rst_markup().RstMarkup())
    )
    for package in ("pool", "envs", "benchmarks"):
        loader.load(package)
    loader.resolve_aliases()
    return loader.modules_collection


@pytest.mark.parametrize("package", PUBLIC)
def test_every_exported_name_has_an_entry(package: str) -> None:
    documented = {target.rsplit(".", 1)[-1] for target in entries() if target.startswith(f"{package}.")}
    missing = sorted(exported(package) - documented)
    assert not missing, f"{package} exports {missing}, which docs/reference/ does not show: add a '::: ' entry"


def test_every_entry_is_the_object_meant_not_a_module_of_the_same_name() -> None:
    modules = [t for t in entries() if t not in MODULE_ENTRIES and loaded()[t].is_module]
    assert not modules, f"these entries render a whole module (a submodule shadows the name): {modules}"


def test_every_entry_resolves_to_a_documented_object() -> None:
    undocumented = [t for t in entries() if not loaded()[t].docstring]
    assert not undocumented, f"public names without a docstring: {undocumented}"


def test_a_role_becomes_inline_code_of_its_target() -> None:
    text = "See :func:`~pool.load_backend`, :class:`pool.Template` and :py:meth:`Sandbox.exec`."
    assert rst_markup().to_markdown(text) == "See `load_backend`, `pool.Template` and `Sandbox.exec`."


def test_a_literal_block_becomes_a_fence_and_its_marker_a_colon() -> None:
    text = "A task is a directory::\n\n    my-task/\n      tests/\n\nAfter.\n\n::\n\n    tree\n"
    assert rst_markup().to_markdown(text) == (
        "A task is a directory:\n\n```text\nmy-task/\n  tests/\n```\n\nAfter.\n\n\n```text\ntree\n```\n"
    )


def test_a_doctest_block_becomes_a_pycon_fence() -> None:
    text = "Use it:\n\n>>> env = make()\n>>> env.reset()\n(obs, info)\n\nThen more."
    assert rst_markup().to_markdown(text) == (
        "Use it:\n\n```pycon\n>>> env = make()\n>>> env.reset()\n(obs, info)\n```\n\nThen more."
    )


def test_the_rewrite_is_idempotent_and_leaves_fences_alone() -> None:
    text = "A :class:`X`::\n\n    a::\n\n>>> 1\n1\n\n```python\n>>> kept\n```"
    once = rst_markup().to_markdown(text)
    assert rst_markup().to_markdown(once) == once
    assert once.endswith("```python\n>>> kept\n```")


def test_the_extension_rewrites_the_docstrings_mkdocstrings_renders() -> None:
    tree = loaded()["pool.errors"].docstring
    assert tree is not None
    assert "`SnapgymError`" in tree.value and ":class:" not in tree.value
    assert "```text\nSnapgymError\n├── ConfigError" in tree.value
