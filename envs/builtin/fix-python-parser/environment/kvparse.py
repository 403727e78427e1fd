r"""Parse ``key=value`` option strings such as ``"host=db1; port=5432; label=a\;b"``.

Format:

* Pairs are separated by ``;``. Empty pairs (only whitespace, e.g. after a trailing ``;``)
  are skipped.
* Each pair is split at its first unescaped ``=``; any later ``=`` belong to the value.
* Leading and trailing whitespace around keys and values is removed.
* A backslash escapes the next character: ``\;`` is a literal ``;``, ``\=`` a literal ``=``
  and ``\\`` a literal backslash. Escaped characters never separate anything. A lone
  backslash at the very end of the input is kept as a literal backslash.
* A non-empty pair without an unescaped ``=``, or with an empty key, raises ValueError.
* When a key appears more than once, the last value wins.
"""

from __future__ import annotations


def _split_unescaped(text: str, sep: str, maxsplit: int = -1) -> list[str]:
    """Split ``text`` at each ``sep`` not preceded by an escaping backslash.

    Escape sequences are kept as they are in the parts; see :func:`_unescape`.
    """
    parts: list[str] = []
    current: list[str] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == "\\":
            current.append(text[i : i + 2])
            i += 1
        elif ch == sep and maxsplit != 0:
            parts.append("".join(current))
            current = []
            maxsplit -= 1
            i += 1
        else:
            current.append(ch)
            i += 1
    parts.append("".join(current))
    return parts


def _unescape(text: str) -> str:
    """Replace each backslash escape with the character it escapes."""
    out: list[str] = []
    i = 0
    while i < len(text):
        if text[i] == "\\" and i + 1 < len(text) - 1:
            out.append(text[i + 1])
            i += 2
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def parse(text: str) -> dict[str, str]:
    """Parse ``text`` into a dict of keys to values (see the module docstring)."""
    result: dict[str, str] = {}
    for pair in _split_unescaped(text, ";"):
        if not pair.strip():
            continue
        pieces = _split_unescaped(pair, "=", maxsplit=1)
        if len(pieces) != 2:
            raise ValueError(f"missing '=' in {pair.strip()!r}")
        key = _unescape(pieces[0].strip())
        value = _unescape(pieces[1].strip())
        if not key:
            raise ValueError(f"empty key in {pair.strip()!r}")
        result[key] = value
    return result
