"""Parse /app/events.csv as CSV and compare it cell by cell with the rows kept in /tests."""

import csv
import io
import json
import sys

sys.path.insert(0, "/tests")
import verifykit as vk  # noqa: E402


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


def check():
    with open("/tests/expected_rows.json", encoding="utf-8") as f:
        expected = json.load(f)
    text = vk.read_text("/app/events.csv", max_bytes=1 << 20)
    try:
        rows = list(csv.reader(io.StringIO(text, newline="")))
    except csv.Error as exc:
        raise vk.Failure(f"cannot read /app/events.csv as CSV: {exc}") from None
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
        raise vk.Failure("\n".join(problems[:20]))


vk.main(check, budget_s=45)
