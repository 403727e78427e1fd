#!/bin/bash
# Verifier for bash-batch-rename: the expected final listing (path -> the file it started as)
# is fixed in /tests/expected.json.
mkdir -p /logs/verifier
python3 - <<'PY'
import json
import os
import sys

root = "/app/photos"
expected = json.load(open("/tests/expected.json"))
found = {}
for dirpath, dirnames, filenames in os.walk(root):
    for name in filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
        path = os.path.join(dirpath, name)
        found[os.path.relpath(path, root)] = path
problems = []
for rel in sorted(set(expected) - set(found)):
    problems.append(f"missing: {rel}")
for rel in sorted(set(found) - set(expected)):
    problems.append(f"unexpected: {rel}")
for rel in sorted(set(expected) & set(found)):
    path = found[rel]
    if os.path.islink(path) or not os.path.isfile(path):
        problems.append(f"not a regular file: {rel}")
        continue
    want = f"image data of {expected[rel]}\n"
    if open(path, encoding="utf-8", errors="replace").read() != want:
        problems.append(f"wrong content in {rel} (expected the former {expected[rel]})")
if problems:
    print("FAIL:\n  " + "\n  ".join(problems))
    sys.exit(1)
print("PASS")
PY
if [ $? -eq 0 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
