#!/bin/bash
# Verifier for find-large-files: the expected listing is fixed in /tests/expected.txt.
mkdir -p /logs/verifier
python3 - <<'PY'
import sys
expected = open("/tests/expected.txt").read().splitlines()
try:
    raw = open("/app/large.txt", encoding="utf-8", errors="replace").read()
except OSError as exc:
    print("FAIL: cannot read /app/large.txt:", exc)
    sys.exit(1)
got = raw.replace("\r\n", "\n").rstrip("\n").split("\n") if raw.strip() else []
if got != expected:
    print("FAIL: /app/large.txt differs from the expected listing")
    print("missing:", sorted(set(expected) - set(got)))
    print("unexpected:", sorted(set(got) - set(expected)))
    if set(got) == set(expected):
        print("(same paths, wrong order or duplicates)")
    sys.exit(1)
print("PASS")
PY
if [ $? -eq 0 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
