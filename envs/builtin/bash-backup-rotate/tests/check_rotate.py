"""Run /app/rotate.sh against fresh fixtures in /app/backups and check what is left."""

import datetime
import os
import re
import shutil
import subprocess

DIR = "/app/backups"
SCRIPT = "/app/rotate.sh"

# Dates deliberately span years and are created out of order.
DATES = ["2024-01-10", "2022-06-15", "2024-02-01", "2023-12-31", "2024-01-02", "2023-01-01",
         "2024-01-09", "2021-11-30"]
DECOYS = [
    "backup-latest.tar.gz",               # matches backup-*.tar.gz but is not a dated backup
    "backup-2024-03-01 copy.tar.gz",      # a space in the name
    "backup-2024-05-01.tar.gz.part",
    "backup-2019-01-01.tgz",
    "db-2020-01-01.tar.gz",
    "README.txt",
    "nested/backup-2018-01-01.tar.gz",   # in a subdirectory
    "nested/backup-2025-01-01.tar.gz",
]


def name(date):
    return f"backup-{date}.tar.gz"


def build(files):
    shutil.rmtree(DIR, ignore_errors=True)
    os.makedirs(DIR)
    # Modification times run against the dates: the oldest name gets the newest mtime.
    for i, rel in enumerate(files):
        path = os.path.join(DIR, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(f"content of {rel}\n")
        match = re.fullmatch(r"backup-(\d{4}-\d{2}-\d{2})\.tar\.gz", rel)
        if match:
            day = datetime.date.fromisoformat(match.group(1)).toordinal()
            stamp = 1_700_000_000 - (day - 738_000) * 86_400
        else:
            stamp = 1_600_000_000 + i * 3_600
        os.utime(path, (stamp, stamp))


def listing():
    found = set()
    for root, _dirs, names in os.walk(DIR):
        for n in names:
            path = os.path.join(root, n)
            rel = os.path.relpath(path, DIR)
            with open(path) as f:
                if f.read() != f"content of {rel}\n":
                    raise SystemExit(f"FAIL: content of {rel} changed")
            found.add(rel)
    return found


def run(args):
    return subprocess.run([SCRIPT, *args], cwd="/tmp", capture_output=True, text=True, timeout=20)


def case(label, files, args, keep_dates, expect_rc=0):
    ordered = sorted(files, key=hash_key)
    build(ordered)
    before = listing()
    result = run(args)
    after = listing()
    if expect_rc == 0:
        if result.returncode != 0:
            raise SystemExit(f"FAIL [{label}]: exit status {result.returncode}: {result.stderr[-500:]}")
        expected = {f for f in before if f not in {name(d) for d in DATES} or f in {name(d) for d in keep_dates}}
    else:
        if result.returncode != expect_rc:
            raise SystemExit(f"FAIL [{label}]: expected exit status {expect_rc}, got {result.returncode}")
        if not result.stderr.strip():
            raise SystemExit(f"FAIL [{label}]: no usage message on stderr")
        expected = before
    if after != expected:
        raise SystemExit(
            f"FAIL [{label}]: rotate.sh {' '.join(args)}\n  deleted wrongly: {sorted(expected - after)}\n"
            f"  kept wrongly: {sorted(after - expected)}"
        )
    print(f"ok [{label}]")


def hash_key(text):
    # A fixed shuffle, independent of Python's hash randomisation.
    return sum((i + 1) * ord(c) for i, c in enumerate(text)) % 97


def main():
    if not os.path.isfile(SCRIPT):
        raise SystemExit("FAIL: /app/rotate.sh does not exist")
    if not os.access(SCRIPT, os.X_OK):
        raise SystemExit("FAIL: /app/rotate.sh is not executable")
    newest_first = sorted(DATES, reverse=True)
    full = [name(d) for d in DATES] + DECOYS
    case("keep 3", full, ["3"], newest_first[:3])
    case("keep 1", full, ["1"], newest_first[:1])
    case("keep 7 of 8", full, ["7"], newest_first[:7])
    case("keep more than exist", full, ["10"], DATES)
    case("keep exactly all", full, ["8"], DATES)
    case("only backups", [name(d) for d in DATES], ["2"], newest_first[:2])
    case("no backups", DECOYS, ["2"], [])
    for bad in (["0"], ["-2"], ["abc"], ["3x"], [""], []):
        case(f"invalid {bad}", full, bad, DATES, expect_rc=1)
    print("PASS")


if __name__ == "__main__":
    main()
