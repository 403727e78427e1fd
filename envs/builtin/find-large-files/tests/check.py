"""Compare /app/large.txt with the expected listing fixed in /tests/expected.txt."""

import sys

sys.path.insert(0, "/tests")
import verifykit as vk  # noqa: E402


def check():
    with open("/tests/expected.txt") as f:
        expected = f.read().splitlines()
    raw = vk.read_output("/app/large.txt", max_bytes=64 * 1024).decode("utf-8", "replace")
    got = raw.replace("\r\n", "\n").rstrip("\n").split("\n") if raw.strip() else []
    if got != expected:
        message = (f"/app/large.txt differs from the expected listing\nmissing: {sorted(set(expected) - set(got))}\n"
                   f"unexpected: {sorted(set(got) - set(expected))[:50]}")  # fmt: skip
        if set(got) == set(expected):
            message += "\n(same paths, wrong order or duplicates)"
        raise vk.Failure(message)


vk.main(check, budget_s=45)
