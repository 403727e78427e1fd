#!/bin/bash
# Parse /app/events.csv as CSV and compare it cell by cell with the rows kept in /tests.
mkdir -p /logs/verifier
python3 - <<'PY'
import csv, json, pathlib

def same(want, got, column):
    if want == got:
        return True
    # Numbers may be spelt differently (3 vs 3.0) as long as the value is the same.
    if column in ("id", "amount") and want and got:
        try:
            return float(want) == float(got)
        except ValueError:
            return False
    return False

reward = 0
expected = json.loads(pathlib.Path("/tests/expected_rows.json").read_text(encoding="utf-8"))
path = pathlib.Path("/app/events.csv")
if not path.is_file():
    print("/app/events.csv is missing")
else:
    try:
        with open(path, encoding="utf-8", newline="") as f:
            rows = [row for row in csv.reader(f)]
    except (UnicodeDecodeError, csv.Error) as exc:
        print(f"cannot read /app/events.csv as UTF-8 CSV: {exc}")
        rows = None
    if rows is not None:
        while rows and rows[-1] == []:
            rows.pop()
        problems = []
        if len(rows) != len(expected):
            problems.append(f"expected {len(expected)} lines (with the header), got {len(rows)}")
        for n, (want, got) in enumerate(zip(expected, rows), 1):
            if n == 1:
                ok = got == want
            else:
                ok = len(got) == len(want) and all(same(w, g, c) for w, g, c in zip(want, got, expected[0]))
            if not ok:
                problems.append(f"line {n}: expected {want} got {got}")
        if problems:
            print(*problems[:20], sep="\n")
        else:
            reward = 1
pathlib.Path("/logs/verifier/reward.txt").write_text(f"{reward}\n")
PY
[ -f /logs/verifier/reward.txt ] || echo 0 > /logs/verifier/reward.txt
exit 0
