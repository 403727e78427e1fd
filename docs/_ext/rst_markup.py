"""A griffe extension for the API reference: the reStructuredText in our docstrings, as Markdown.

The docstrings are Google-style (``Args:``, ``Raises:``, which griffe parses), but their inline markup
is Sphinx's: roles (:class:`Pool`, :func:`~pool.load_backend`), literal blocks after ``::`` and
doctest blocks (``>>>``). Markdown would show a role as its raw text, run a literal block into the
paragraph around it and quote a doctest block three levels deep. Before mkdocstrings renders a
docstring, this rewrites those three constructs:

- a role becomes inline code of its target (``~a.b.C`` shows ``C``, as in Sphinx);
- a paragraph's closing ``::`` becomes ``:`` (a ``::`` alone on its line goes) and the indented block
  after it becomes a fenced ``text`` block;
- a doctest block (from a ``>>>`` line to the next blank line) becomes a fenced ``pycon`` block.

Nothing else changes, and nothing inside a Markdown fence: double backquotes are already inline code in
Markdown. mkdocs.yml loads it (``extensions`` of the Python handler); the rewrite itself is
:func:`to_markdown`, tested in tests/test_api_reference.py.
"""

from __future__ import annotations

import re
import textwrap
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?(?:class|func|data|mod|meth|attr|exc|obj|const):`(~?)([^`]+)`")
"""A Sphinx role of the Python domain: its ``~`` and its target."""


def to_markdown(text: str) -> str:
    """A docstring's reStructuredText roles, literal blocks and doctest blocks, as Markdown."""
    return "\n".join(_blocks(ROLE.sub(_role, text).split("\n")))


def _role(match: re.Match[str]) -> str:
    tilde, target = match.groups()
    return f"`{target.rsplit('.', 1)[-1] if tilde else target}`"


def _blocks(lines: list[str]) -> list[str]:
    out: list[str] = []
    fenced = False
    i = 0
    while i < len(lines):
        line = lines[i]
        is_fence = line.lstrip().startswith("```")
        fenced ^= is_fence
        if fenced or is_fence:  # a Markdown fence already: keep it and what it holds
            out.append(line)
            i += 1
        elif line.rstrip().endswith("::"):
            if line.strip() != "::":
                out.append(line.rstrip()[:-1])
            i = _literal(lines, i + 1, _indent(line), out)
        elif line.lstrip().startswith(">>>"):
            i = _doctest(lines, i, out)
        else:
            out.append(line)
            i += 1
    return out


def _literal(lines: list[str], start: int, base: int, out: list[str]) -> int:
    """Fence the block indented deeper than ``base`` that starts after ``start``'s blank lines."""
    end = start
    while end < len(lines) and not lines[end].strip():
        end += 1
    body_start = end
    while end < len(lines) and (not lines[end].strip() or _indent(lines[end]) > base):
        end += 1
    while end > body_start and not lines[end - 1].strip():
        end -= 1
    if end == body_start:  # no indented block: the "::" was prose
        return start
    pad = " " * base
    body = textwrap.dedent("\n".join(lines[body_start:end])).split("\n")
    out += ["", f"{pad}```text", *(f"{pad}{b}" if b else "" for b in body), f"{pad}```"]
    return end


def _doctest(lines: list[str], start: int, out: list[str]) -> int:
    end = start
    while end < len(lines) and lines[end].strip():
        end += 1
    pad = " " * _indent(lines[start])
    body = textwrap.dedent("\n".join(lines[start:end])).split("\n")
    out += [f"{pad}```pycon", *(f"{pad}{b}" for b in body), f"{pad}```"]
    return end


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


class RstMarkup(griffe.Extension):
    """Rewrites every loaded object's docstring with :func:`to_markdown`."""

    def on_object(self, *, obj: griffe.Object, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        """Rewrite ``obj``'s docstring, once the whole tree is loaded."""
        if obj.docstring is not None:
            obj.docstring.value = to_markdown(obj.docstring.value)
