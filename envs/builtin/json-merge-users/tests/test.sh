#!/bin/bash
# Compare /app/users.json with the expected merge kept in /tests.
mkdir -p /logs/verifier
python3 - <<'PY'
import json, pathlib

def normalise(records):
    # A null-valued field counts as absent, so either way of leaving it out is accepted.
    return [{k: v for k, v in r.items() if v is not None} for r in records]

reward = 0
path = pathlib.Path("/app/users.json")
expected = json.loads(pathlib.Path("/tests/expected_users.json").read_text())
try:
    actual = json.loads(path.read_text())
except FileNotFoundError:
    print("/app/users.json is missing")
except (ValueError, UnicodeDecodeError) as exc:
    print(f"/app/users.json is not valid JSON: {exc}")
else:
    if not isinstance(actual, list) or not all(isinstance(r, dict) for r in actual):
        print("/app/users.json must be a JSON array of objects")
    elif any(type(r.get("id")) is not int for r in actual):
        print("every id must be a JSON integer")
    elif normalise(actual) == normalise(expected):
        reward = 1
    else:
        print(f"expected {len(expected)} users, got {len(actual)}")
        by_id = {r.get("id"): r for r in actual}
        for want in expected:
            got = by_id.get(want["id"])
            if got is None or normalise([got]) != normalise([want]):
                print("id", want["id"], "expected", json.dumps(want, sort_keys=True), "got", json.dumps(got, sort_keys=True))
        if [r.get("id") for r in actual] != sorted(r.get("id") for r in actual):
            print("records are not sorted by id")
pathlib.Path("/logs/verifier/reward.txt").write_text(f"{reward}\n")
PY
[ -f /logs/verifier/reward.txt ] || echo 0 > /logs/verifier/reward.txt
exit 0
