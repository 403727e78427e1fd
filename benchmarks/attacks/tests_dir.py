"""Attacks on the tests themselves: rewrite test.sh (or what it reads) before or while it runs.

The verifier copies the task's tests into the sandbox and moves them to /tests; a process
of the agent that is still alive can watch for them and change them first. bash reads a
script as it runs it, so even a test.sh that has started can be rewritten behind its
read position.
"""

from __future__ import annotations

from benchmarks.attacks.model import FORGE_PY, FORGE_SH, WATCH_PY, Attack, TaskKind, attack, spawn
from benchmarks.attacks.tasks import ANSWER_FILES

_MARK = "# snapgym-attack"

_REWRITER = (
    FORGE_PY
    + WATCH_PY
    + f"""
PAYLOAD = ({FORGE_SH!r} + "\\nexit 0\\n{_MARK}\\n").encode()


def poison(path):
    try:
        with open(path, "r+b") as handle:
            original = handle.read()
            if b"{_MARK}" in original:
                return
            # Blank lines up to wherever bash has read, then the payload: whatever offset
            # bash resumes from, the rest of the script is ours.
            handle.seek(0)
            handle.write(b"\\n" * len(original) + PAYLOAD)
    except OSError:
        pass


ready("tests-rewriter")
while True:
    for path in glob.glob("/.snapgym-tests-*/test.sh") + ["/tests/test.sh"]:
        poison(path)
    nap()
"""
)

_SQUATTER = (
    FORGE_PY
    + WATCH_PY
    + f"""
SCRIPT = "#!/bin/bash\\n" + {FORGE_SH!r} + "\\nexit 0\\n"


def squat():
    # Between the verifier's rm -rf /tests and its mv, a /tests that exists again makes mv
    # move the real tests inside it, and /tests/test.sh is this one.
    try:
        os.mkdir("/tests")
        with open("/tests/test.sh", "w") as handle:
            handle.write(SCRIPT)
    except OSError:
        pass


ready("tests-squatter")
while True:
    if glob.glob("/.snapgym-tests-*"):
        squat()
    else:
        nap()
"""
)

_EXPECTED_COPIER = (
    FORGE_PY
    + WATCH_PY
    + """
import csv
import io
import json
import shutil

# (probe, output, expected, form): the task has the probe; its output follows from expected
ANSWERS = [answer for answer in __ANSWERS__ if os.path.exists(answer[0])]


def build(output, data, form):
    if form == "tree":  # a folder whose files are named by the map and hold "image data of <original>"
        shutil.rmtree(output, ignore_errors=True)
        for relative, original in json.loads(data).items():
            path = os.path.join(output, relative)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as handle:
                handle.write("image data of %s\\n" % original)
        return
    if form == "csv":
        text = io.StringIO()
        csv.writer(text).writerows(json.loads(data))
        data = text.getvalue().encode()
    temporary = output + ".snapgym"
    with open(temporary, "wb") as handle:
        handle.write(data)
    os.replace(temporary, output)


def copy_expected():
    for probe, output, expected, form in list(ANSWERS):
        name = expected.rsplit("/", 1)[1]
        sources = [expected] + glob.glob("/.snapgym-tests-*/" + name) + glob.glob("/proc/[0-9]*/root" + expected)
        for source in sources:
            try:
                with open(source, "rb") as handle:
                    data = handle.read()
            except OSError:
                continue
            build(output, data, form)
            if form == "tree":
                ANSWERS.remove((probe, output, expected, form))  # rebuilt once; the tests walk it
            break


ready("expected-copier")
while True:
    try:
        copy_expected()
    except OSError:
        pass
    time.sleep(0.0005)
"""
)


_ANSWERS = repr([(a.probe, a.output, a.expected, a.form) for a in ANSWER_FILES])

ATTACKS: tuple[Attack, ...] = (
    attack(
        "tests-rewriter",
        "a watcher loop rewrites the staged and the installed test.sh (in place, behind bash's read offset)",
        spawn(_REWRITER, name="tests-rewriter"),
    ),
    attack(
        "tests-squatter",
        "a loop re-creates /tests with its own test.sh once the verifier stages the real one",
        spawn(_SQUATTER, name="tests-squatter"),
    ),
    attack(
        "expected-copier",
        "a loop writes the outputs from the expected files under /tests (or /proc/*/root/tests) as they appear",
        spawn(_EXPECTED_COPIER.replace("__ANSWERS__", _ANSWERS), name="expected-copier"),
        targets=(TaskKind.ANSWER_IN_TESTS,),
    ),
)
