"""Compare /app/photos with the expected final listing (path -> the file it started as) in /tests."""

import json
import os
import stat
import sys

sys.path.insert(0, "/tests")
import verifykit as vk  # noqa: E402

ROOT = "/app/photos"


def check():
    with open("/tests/expected.json") as f:
        expected = json.load(f)
    # Everything but real folders counts: files, and links or FIFOs in their place.
    found = {rel: st for rel, st in vk.walk_output(ROOT, max_entries=1000).items() if not stat.S_ISDIR(st.st_mode)}
    problems = [f"missing: {rel}" for rel in sorted(set(expected) - set(found))]
    problems += [f"unexpected: {rel}" for rel in sorted(set(found) - set(expected))]
    for rel in sorted(set(expected) & set(found)):
        if not stat.S_ISREG(found[rel].st_mode):
            problems.append(f"not a regular file: {rel}")
            continue
        want = f"image data of {expected[rel]}\n".encode()
        if vk.read_output(os.path.join(ROOT, rel), max_bytes=4096) != want:
            problems.append(f"wrong content in {rel} (expected the former {expected[rel]})")
    if problems:
        raise vk.Failure("\n  " + "\n  ".join(problems))


vk.main(check, budget_s=45)
