"""Check /app/Makefile: the build, the program's output, incremental rebuilds and clean.

make runs the agent's recipes, so it runs as the untrusted user (owner of /app for the time of
the checks, so that it can create and delete files there), and so does the program it builds.
Timestamps are fixed old dates, so the one-second mtime resolution never matters.
"""

import calendar
import hashlib
import os
import stat
import sys
import time

sys.path.insert(0, "/tests")
import verifykit as vk  # noqa: E402

APP = "/app"
OBJS = ["main.o", "lexer.o", "eval.o"]
SRCS = ["main.c", "lexer.c", "eval.c", "calc.h"]
OLD_SRC = calendar.timegm((2020, 1, 1, 0, 0, 0))
OLD_OBJ = calendar.timegm((2021, 1, 1, 0, 0, 0))
OLD_BIN = calendar.timegm((2021, 6, 1, 0, 0, 0))


def path(name):
    return os.path.join(APP, name)


def sources_unchanged(why):
    with open("/tests/sources.sha256") as f:
        for line in f:
            digest, name = line.split()
            if hashlib.sha256(vk.read_output(name)).hexdigest() != digest:
                raise vk.Failure(f"{why}: {name} was modified")


def make(*args):
    result = vk.run_untrusted(["make", *args], cwd=APP, timeout_s=60)
    if result.returncode != 0:
        raise vk.Failure(f"make {' '.join(args)} failed:\n{result.text()}")


def mtime(name):
    st = vk.lstat_output(path(name))
    return None if st is None else int(st.st_mtime)


def regular(name):
    st = vk.lstat_output(path(name))
    return st is not None and stat.S_ISREG(st.st_mode)


def rebuilt(name):
    return regular(name) and mtime(name) > OLD_OBJ


def kept(name):
    return regular(name) and mtime(name) == OLD_OBJ


def age_all():
    """Sources oldest, then objects, then the binary: everything up to date."""
    for names, stamp in ((SRCS, OLD_SRC), (OBJS, OLD_OBJ), (["calc"], OLD_BIN)):
        for name in names:
            if not regular(name):
                raise vk.Failure(f"/app/{name} is missing or not a regular file")
            os.utime(path(name), (stamp, stamp), follow_symlinks=False)


def calc(expression, expected):
    result = vk.run_untrusted(["./calc", expression], cwd=APP, timeout_s=5)
    got = result.stdout.decode("utf-8", "replace").rstrip("\n")
    if result.returncode != 0 or got != expected:
        raise vk.Failure(f"calc '{expression}' printed '{got}' (status {result.returncode}), expected '{expected}'")


def check():
    st = vk.lstat_output(APP)
    if st is None or not stat.S_ISDIR(st.st_mode):
        raise vk.Failure("/app is not a directory")
    if not regular("Makefile"):
        raise vk.Failure("/app/Makefile is missing")
    vk.read_output(path("Makefile"), max_bytes=1 << 20)
    sources_unchanged("before the build")
    vk.give_to_untrusted(APP)
    vk.give_to_untrusted(path("Makefile"))
    for name in SRCS:
        vk.let_untrusted_read(path(name))

    # 1. Clean build from scratch.
    make("clean")
    for name in ["calc", *OBJS]:
        vk.remove_output(path(name))
    make()
    st = vk.lstat_output(path("calc"))
    if st is None or not stat.S_ISREG(st.st_mode) or not st.st_mode & 0o100:
        raise vk.Failure("make did not produce /app/calc")
    for name in OBJS:
        if not regular(name):
            raise vk.Failure(f"make did not produce /app/{name}")

    # 2. The program works.
    for expression, expected in (("2 + 3 * 4", "14"), ("2 ^ 10", "1024"), ("(1 + 2) * -3", "-9"), ("7 / 2", "3.5"),
                                 ("2 ^ 0.5", "1.414213562"), ("2 ^ 3 ^ 2", "512"), ("1.5e3 + .25", "1500.25")):
        calc(expression, expected)
    if vk.run_untrusted(["./calc", "2 +"], cwd=APP, timeout_s=5).returncode == 0:
        raise vk.Failure("calc accepted an invalid expression")

    # 3. Nothing changed: nothing is rebuilt.
    age_all()
    make()
    for name in OBJS:
        if not kept(name):
            raise vk.Failure(f"{name} was rebuilt although nothing changed")
    if mtime("calc") != OLD_BIN:
        raise vk.Failure("calc was relinked although nothing changed")

    # 4. One .c changed: only its object is recompiled, calc relinked.
    age_all()
    os.utime(path("eval.c"), (time.time(), time.time()), follow_symlinks=False)
    make()
    if not rebuilt("eval.o"):
        raise vk.Failure("eval.o was not recompiled after eval.c changed")
    for name in ("main.o", "lexer.o"):
        if not kept(name):
            raise vk.Failure(f"{name} was recompiled although only eval.c changed")
    if not rebuilt("calc"):
        raise vk.Failure("calc was not relinked after eval.c changed")

    # 5. The header changed: every object is recompiled.
    age_all()
    os.utime(path("calc.h"), (time.time(), time.time()), follow_symlinks=False)
    make()
    for name in OBJS:
        if not rebuilt(name):
            raise vk.Failure(f"{name} was not recompiled after calc.h changed")
    if not rebuilt("calc"):
        raise vk.Failure("calc was not relinked after calc.h changed")
    calc("2 ^ 10", "1024")

    # 6. make clean removes the outputs and nothing else.
    make("clean")
    for name in ["calc", *OBJS]:
        if vk.lstat_output(path(name)) is not None:
            raise vk.Failure(f"make clean left {name}")
    sources_unchanged("make clean removed or changed sources")
    if not regular("Makefile"):
        raise vk.Failure("make clean removed the Makefile")


vk.main(check, budget_s=45)
