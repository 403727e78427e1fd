#!/bin/bash
set -e
cd /app
python3 - <<'PY'
import pathlib
path = pathlib.Path("/app/stats.py")
src = path.read_text()
# Bug 1: median must sort its input.
src = src.replace(
    "    values = _as_list(data)\n    n = len(values)\n",
    "    values = sorted(_as_list(data))\n    n = len(values)\n",
)
# Bug 2: the sample variance divides by n - 1.
src = src.replace(
    "return sum((x - m) ** 2 for x in values) / len(values)",
    "return sum((x - m) ** 2 for x in values) / (len(values) - 1)",
)
path.write_text(src)
PY
python3 -m unittest test_stats
