"""Compare /app/users.json with the expected merge kept in /tests."""

import json
import sys

sys.path.insert(0, "/tests")
import verifykit as vk  # noqa: E402


def normalise(records):
    # A null-valued field counts as absent, so either way of leaving it out is accepted.
    return [{k: v for k, v in r.items() if v is not None} for r in records]


def check():
    with open("/tests/expected_users.json") as f:
        expected = json.load(f)
    raw = vk.read_output("/app/users.json", max_bytes=1 << 20)
    try:
        actual = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise vk.Failure(f"/app/users.json is not valid JSON: {str(exc)[:200]}") from None
    if not isinstance(actual, list) or not all(isinstance(r, dict) for r in actual):
        raise vk.Failure("/app/users.json must be a JSON array of objects")
    if any(type(r.get("id")) is not int for r in actual):
        raise vk.Failure("every id must be a JSON integer")
    if normalise(actual) == normalise(expected):
        return
    lines = [f"expected {len(expected)} users, got {len(actual)}"]
    by_id = {r.get("id"): r for r in actual}
    for want in expected:
        got = by_id.get(want["id"])
        if got is None or normalise([got]) != normalise([want]):
            lines.append(f"id {want['id']} expected {json.dumps(want, sort_keys=True)} got "
                         f"{json.dumps(got, sort_keys=True)[:500]}")  # fmt: skip
    if [r.get("id") for r in actual] != sorted(r.get("id") for r in actual):
        lines.append("records are not sorted by id")
    raise vk.Failure("\n".join(lines[:30]))


vk.main(check, budget_s=45)
