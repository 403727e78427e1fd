#!/bin/bash
set -e
python3 - <<'PY'
import pathlib
path = pathlib.Path("/app/kvparse.py")
src = path.read_text()
# Bug 1: an escape sequence is two characters; skip both so the escaped one never splits.
old = '            current.append(text[i : i + 2])\n            i += 1\n'
assert old in src
src = src.replace(old, '            current.append(text[i : i + 2])\n            i += 2\n')
# Bug 2: off-by-one; an escape ending exactly at the end of the text must be unescaped too.
old = 'if text[i] == "\\\\" and i + 1 < len(text) - 1:'
assert old in src
src = src.replace(old, 'if text[i] == "\\\\" and i + 1 < len(text):')
path.write_text(src)
PY
