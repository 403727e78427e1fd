#!/bin/bash
# Compare the edited file with the expected file kept in /tests (the agent never sees it).
# The only leniency: a missing final newline at the end of the file.
mkdir -p /logs/verifier
python3 - <<'PY'
import difflib, pathlib, sys
expected = pathlib.Path("/tests/expected.conf").read_text()
path = pathlib.Path("/app/app.conf")
reward = 0
if not path.is_file():
    print("/app/app.conf is missing")
else:
    actual = path.read_text(errors="replace")
    if actual and not actual.endswith("\n"):
        actual += "\n"
    if actual == expected:
        reward = 1
    else:
        sys.stdout.writelines(difflib.unified_diff(
            expected.splitlines(True), actual.splitlines(True), "expected", "/app/app.conf"))
pathlib.Path("/logs/verifier/reward.txt").write_text(f"{reward}\n")
PY
[ -f /logs/verifier/reward.txt ] || echo 0 > /logs/verifier/reward.txt
exit 0
