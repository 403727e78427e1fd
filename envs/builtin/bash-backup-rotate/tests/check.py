"""Run /app/rotate.sh, as the untrusted user, on fresh fixtures in /app/backups; check what is left."""

import datetime
import os
import re
import stat
import sys

sys.path.insert(0, "/tests")
import verifykit as vk  # noqa: E402

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
    """Fresh fixtures, owned by the untrusted user so that the script can delete them."""
    vk.remove_output(DIR)
    os.mkdir(DIR)
    os.chmod(DIR, 0o755)
    vk.give_to_untrusted(DIR)
    # Modification times run against the dates: the oldest name gets the newest mtime.
    for i, rel in enumerate(files):
        path = os.path.join(DIR, rel)
        if not os.path.isdir(os.path.dirname(path)):
            os.mkdir(os.path.dirname(path))
            os.chmod(os.path.dirname(path), 0o755)
            vk.give_to_untrusted(os.path.dirname(path))
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        os.write(fd, f"content of {rel}\n".encode())
        os.close(fd)
        os.chmod(path, 0o644)
        vk.give_to_untrusted(path)
        match = re.fullmatch(r"backup-(\d{4}-\d{2}-\d{2})\.tar\.gz", rel)
        if match:
            day = datetime.date.fromisoformat(match.group(1)).toordinal()
            stamp = 1_700_000_000 - (day - 738_000) * 86_400
        else:
            stamp = 1_600_000_000 + i * 3_600
        os.utime(path, (stamp, stamp), follow_symlinks=False)


def listing():
    """The files left in DIR; each must be a regular file with its original content."""
    found = set()
    for rel, st in vk.walk_output(DIR, max_entries=1000).items():
        if stat.S_ISDIR(st.st_mode):
            continue
        if not stat.S_ISREG(st.st_mode):
            raise vk.Failure(f"{DIR}/{rel} is not a regular file")
        if vk.read_output(os.path.join(DIR, rel), max_bytes=4096) != f"content of {rel}\n".encode():
            raise vk.Failure(f"content of {rel} changed")
        found.add(rel)
    return found


def run(args):
    return vk.run_untrusted([SCRIPT, *args], cwd=vk.untrusted_dir(), timeout_s=10)


def case(label, files, args, keep_dates, expect_rc=0):
    build(sorted(files, key=hash_key))
    before = listing()
    result = run(args)
    after = listing()
    if result.timed_out:
        raise vk.Failure(f"[{label}]: rotate.sh {' '.join(args)} did not finish within 10 s")
    if expect_rc == 0:
        if result.returncode != 0:
            raise vk.Failure(f"[{label}]: exit status {result.returncode}: {result.stderr[-500:]!r}")
        expected = {f for f in before if f not in {name(d) for d in DATES} or f in {name(d) for d in keep_dates}}
    else:
        if result.returncode != expect_rc:
            raise vk.Failure(f"[{label}]: expected exit status {expect_rc}, got {result.returncode}")
        if not result.stderr.strip():
            raise vk.Failure(f"[{label}]: no usage message on stderr")
        expected = before
    if after != expected:
        raise vk.Failure(
            f"[{label}]: rotate.sh {' '.join(args)}\n  deleted wrongly: {sorted(expected - after)}\n"
            f"  kept wrongly: {sorted(after - expected)}"
        )
    print(f"ok [{label}]")


def hash_key(text):
    # A fixed shuffle, independent of Python's hash randomisation.
    return sum((i + 1) * ord(c) for i, c in enumerate(text)) % 97


def check():
    st = vk.lstat_output(SCRIPT)
    if st is None:
        raise vk.Failure(f"{SCRIPT} does not exist")
    if not stat.S_ISREG(st.st_mode):
        raise vk.Failure(f"{SCRIPT} is not a regular file")
    if not st.st_mode & 0o111:
        raise vk.Failure(f"{SCRIPT} is not executable")
    vk.read_output(SCRIPT, max_bytes=1 << 20)  # a script, not a 1 TiB file of zeros
    vk.give_to_untrusted(SCRIPT)  # runnable by the untrusted user whatever its group and other bits
    vk.give_to_untrusted("/app")  # a script may keep a log or a lock next to itself
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


vk.main(check, budget_s=45)
