"""Build /app/wordcount.c as the Makefile does, and with AddressSanitizer; run both on /tests/inputs.

The agent's source is compiled and run as the untrusted user, never as root: it cannot read the
expected outputs (root-only in /tests), the reward, or this process. The build uses fixed flags
(the task's Makefile recipe), not the agent's Makefile, which the task does not ask to change.
"""

import os
import shutil
import sys

sys.path.insert(0, "/tests")
import verifykit as vk  # noqa: E402

SOURCE = "/app/wordcount.c"
BUILDS = {
    "wordcount": ["gcc", "-Wall", "-O2", "-o", "wordcount", "wordcount.c"],
    "wordcount_asan": ["gcc", "-fsanitize=address", "-fno-omit-frame-pointer", "-g", "-O1", "-o", "wordcount_asan",
                       "wordcount.c"],
}
ASAN = {"ASAN_OPTIONS": "detect_leaks=0"}
RUN_TIMEOUT_S = 5


def build():
    """The two binaries, moved where the untrusted user cannot replace them."""
    source = vk.read_output(SOURCE, max_bytes=1 << 20)
    box = vk.untrusted_dir()
    with open(os.path.join(box, "wordcount.c"), "wb") as f:
        f.write(source)
    os.chmod(os.path.join(box, "wordcount.c"), 0o644)
    bins = vk.private_dir()
    os.chmod(bins, 0o755)
    for name, argv in BUILDS.items():
        result = vk.run_untrusted(argv, cwd=box, timeout_s=60)
        if result.returncode != 0:
            raise vk.Failure(f"{' '.join(argv)} failed:\n{result.text()}")
        binary = vk.read_output(os.path.join(box, name), max_bytes=64 << 20)
        with open(os.path.join(bins, name), "wb") as f:
            f.write(binary)
        os.chmod(os.path.join(bins, name), 0o755)
    return [os.path.join(bins, name) for name in BUILDS]


def inputs():
    """A root-owned, world-readable copy of /tests/inputs (the expected outputs stay private)."""
    folder = vk.private_dir()
    os.chmod(folder, 0o755)
    for name in sorted(os.listdir("/tests/inputs")):
        shutil.copyfile(f"/tests/inputs/{name}", os.path.join(folder, name))
        os.chmod(os.path.join(folder, name), 0o644)
    return folder


def run(binary, *args):
    result = vk.run_untrusted([binary, *args], cwd=vk.untrusted_dir(), timeout_s=RUN_TIMEOUT_S, env=ASAN)
    if result.timed_out:
        raise vk.Failure(f"{os.path.basename(binary)} {' '.join(args)} did not finish within {RUN_TIMEOUT_S} s")
    return result


def check():
    binaries = build()
    folder = inputs()
    for binary in binaries:
        label = os.path.basename(binary)
        for name in sorted(os.listdir(folder)):
            result = run(binary, os.path.join(folder, name))
            if result.returncode != 0:
                raise vk.Failure(f"{label} {name} exited with status {result.returncode}: {result.stderr[:2000]!r}")
            with open(f"/tests/expected/{name}.out", "rb") as f:
                expected = f.read()
            if result.stdout != expected:
                raise vk.Failure(f"{label} {name}: wrong output\n  expected {expected[:400]!r}\n"
                                 f"  got      {result.stdout[:400]!r}")
        result = run(binary, "/nonexistent/input.txt")
        if result.returncode != 1:
            raise vk.Failure(f"{label} on a missing file exited with {result.returncode}, expected 1")
        if result.stdout:
            raise vk.Failure(f"{label} on a missing file printed to stdout")
        if not result.stderr:
            raise vk.Failure(f"{label} on a missing file printed no error to stderr")
        if b"AddressSanitizer" in result.stderr:
            raise vk.Failure(f"{label}: AddressSanitizer report on a missing file")
        result = run(binary)
        if result.returncode != 2:
            raise vk.Failure(f"{label} without arguments exited with {result.returncode}, expected 2")
        if not result.stderr:
            raise vk.Failure(f"{label} without arguments printed no usage message")
        result = run(binary, os.path.join(folder, "basic.txt"), os.path.join(folder, "tie.txt"))
        if result.returncode != 2:
            raise vk.Failure(f"{label} with two arguments exited with {result.returncode}, expected 2")


vk.main(check, budget_s=45)
