"""The lexical side of a Dockerfile: its instructions with their line numbers, variable expansion
as Docker does it, and the packages an ``apt-get install`` names. :mod:`pool.build.dockerfile` turns
these into build steps."""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping

LITERAL_DOLLAR = "\x00snapgym-dollar\x00"
"""What an escaped ``\\$`` stands as while ENV values are expanded, put back as ``$`` after."""


_VARIABLE = re.compile(r"\\\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?::([-+])(.*?))?\}|\$([A-Za-z_][A-Za-z0-9_]*)")


def expand(text: str, values: Mapping[str, str]) -> str:
    """Docker's variable substitution: $VAR, ${VAR}, ${VAR:-default}, ${VAR:+alt}, \\$."""

    def one(match: re.Match[str]) -> str:
        if match.group(0) == "\\$":
            return "$"
        name = match.group(1) or match.group(4)
        value = values.get(name)
        if match.group(2) == "-":
            return value if value else match.group(3)
        if match.group(2) == "+":
            return match.group(3) if value else ""
        return value or ""

    return _VARIABLE.sub(one, text)


def instructions(text: str) -> list[tuple[int, str, str]]:
    """(line number, KEYWORD, arguments) with continuations joined and comments dropped."""
    result: list[tuple[int, str, str]] = []
    buffer: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if stripped.startswith("#") or (not stripped and buffer):
            continue
        if not buffer:
            start = number
        if stripped.endswith("\\"):
            buffer.append(stripped[:-1])
            continue
        buffer.append(stripped)
        joined = " ".join(part.strip() for part in buffer).strip()
        buffer = []
        if joined:
            keyword, _, rest = joined.partition(" ")
            result.append((start, keyword.upper(), rest.strip()))
    if buffer:
        keyword, _, rest = " ".join(buffer).strip().partition(" ")
        result.append((start, keyword.upper(), rest.strip()))
    return result


_SEPARATORS = {"&&", "||", ";", "|", "&"}


def apt_packages(command: str) -> list[str]:
    """Package names given to ``apt-get install`` / ``apt install`` in a shell command."""
    try:
        lexer = shlex.shlex(command, posix=True, punctuation_chars=";&|")
        lexer.whitespace_split = True
        tokens = list(lexer)
    except ValueError:
        return []
    packages: list[str] = []
    for index, token in enumerate(tokens):
        if token not in ("apt-get", "apt") or index + 1 >= len(tokens):
            continue
        rest = []
        for word in tokens[index + 1 :]:
            if word in _SEPARATORS:
                break
            rest.append(word)
        if "install" not in rest:
            continue
        after = rest[rest.index("install") + 1 :]
        skip_next = False
        for word in after:
            if skip_next:
                skip_next = False
            elif word in ("-o", "-t", "--target-release"):
                skip_next = True
            elif not word.startswith("-"):
                packages.append(re.split(r"[=:]", word, maxsplit=1)[0])
    return packages
