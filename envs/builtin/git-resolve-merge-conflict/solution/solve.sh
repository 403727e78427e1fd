#!/bin/bash
set -e
cd /app/repo
git checkout -q main
git -c user.name="Oracle" -c user.email="oracle@example.com" merge --no-edit feature || true
python3 - <<'PY'
import re
path = "CHANGELOG.md"
text = open(path).read()
text = re.sub(
    r"<<<<<<< [^\n]*\n(.*?)=======\n(.*?)>>>>>>> [^\n]*\n",
    lambda m: m.group(1) + m.group(2),
    text,
    flags=re.S,
)
open(path, "w").write(text)
PY
git add CHANGELOG.md
git -c user.name="Oracle" -c user.email="oracle@example.com" commit -q --no-edit
