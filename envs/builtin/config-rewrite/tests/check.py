"""Compare the edited /app/app.conf with the expected file kept in /tests (the agent never sees it).

The only leniency: a missing final newline at the end of the file.
"""

import difflib
import sys

sys.path.insert(0, "/tests")
import verifykit as vk  # noqa: E402


def check():
    with open("/tests/expected.conf") as f:
        expected = f.read()
    actual = vk.read_output("/app/app.conf", max_bytes=64 * 1024).decode("utf-8", "replace")
    if actual and not actual.endswith("\n"):
        actual += "\n"
    if actual != expected:
        diff = "".join(difflib.unified_diff(expected.splitlines(True), actual.splitlines(True), "expected",
                                            "/app/app.conf"))  # fmt: skip
        raise vk.Failure(f"/app/app.conf differs from the expected file:\n{diff}")


vk.main(check, budget_s=45)
