#!/bin/bash
cd /testbed
python3 - <<'PY'
import pathlib
path = pathlib.Path("calc/stats.py")
text = path.read_text()
path.write_text(text.replace("    values = list(values)\n", "    values = list(values)\n    if not values:\n        return 0.0\n"))
PY
