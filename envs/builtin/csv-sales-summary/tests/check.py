"""The expected totals are hard-coded here, so editing sales.csv cannot change them."""

import sys

sys.path.insert(0, "/tests")
import verifykit as vk  # noqa: E402

EXPECTED = """region,revenue
Central,26019.81
East,17724.45
North,18614.34
Northeast,39801.05
Pacific,26616.06
South,28695.96
West,36898.17""".splitlines()


def check():
    # Accept CRLF line endings (Python's csv module writes them) and a final newline.
    text = vk.read_output("/app/summary.csv", max_bytes=64 * 1024).decode("utf-8", "replace")
    lines = text.replace("\r\n", "\n").split("\n")
    while lines and lines[-1] == "":
        lines.pop()
    if lines != EXPECTED:
        raise vk.Failure("\n".join(["expected:", *EXPECTED, "actual:", *lines[:50]]))


vk.main(check, budget_s=45)
