#!/bin/bash
# The expected totals are hard-coded here, so editing sales.csv cannot change them.
mkdir -p /logs/verifier
python3 - <<'PY'
import pathlib
expected = """region,revenue
Central,26019.81
East,17724.45
North,18614.34
Northeast,39801.05
Pacific,26616.06
South,28695.96
West,36898.17""".splitlines()
reward = 0
path = pathlib.Path("/app/summary.csv")
if not path.is_file():
    print("/app/summary.csv is missing")
else:
    # Accept CRLF line endings (Python's csv module writes them) and a final newline.
    lines = path.read_text(errors="replace").replace("\r\n", "\n").split("\n")
    while lines and lines[-1] == "":
        lines.pop()
    if lines == expected:
        reward = 1
    else:
        print("expected:", *expected, sep="\n")
        print("actual:", *lines, sep="\n")
pathlib.Path("/logs/verifier/reward.txt").write_text(f"{reward}\n")
PY
[ -f /logs/verifier/reward.txt ] || echo 0 > /logs/verifier/reward.txt
exit 0
