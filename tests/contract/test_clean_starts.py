"""Clean starts: whatever an episode does to its sandbox, the next one starts with all its limits.

Each episode gets an instance of its own (new namespaces, a fresh writable tmpfs, cgroups of its own),
and restore() answers once the last one's init is killed (its processes die in cgroups and namespaces
of their own, off the request path), so a fork bomb, a memory hog,
a million files, a full disk or a storm of zombies left running cannot reach the next episode.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest

from pool import LocalBackend, LocalSandbox, Template

MEMORY_MB, PIDS, DISK_MB = 512, 256, 256

# Small C helpers, compiled into the snapshot: a file maker and a check that the limits are all there.
MKFILES = r"""
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>
int main(int argc, char **argv) {
    long n = atol(argv[1]), made = 0;
    char name[32];
    for (long d = 0; made < n; d++) {
        snprintf(name, sizeof name, "d%ld", d);
        if (mkdir(name, 0755) < 0 || chdir(name) < 0) break;
        for (int i = 0; i < 10000 && made < n; i++, made++) {
            snprintf(name, sizeof name, "%d", i);
            int fd = open(name, O_CREAT | O_WRONLY, 0644);
            if (fd < 0) { printf("%ld\n", made); return 0; }
            close(fd);
        }
        if (chdir("..") < 0) break;
    }
    printf("%ld\n", made);
    return 0;
}
"""
FULLCHECK = r"""
#define _GNU_SOURCE
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
int main(int argc, char **argv) {
    int pids = atoi(argv[1]);
    long mem = atol(argv[2]) << 20, disk = atol(argv[3]) << 20;
    pid_t kids[4096];
    int n = 0;
    for (; n < pids; n++) {
        kids[n] = fork();
        if (kids[n] < 0) break;
        if (kids[n] == 0) { pause(); _exit(0); }
    }
    for (int i = 0; i < n; i++) kill(kids[i], SIGKILL);
    while (wait(NULL) > 0) {}
    char *p = malloc(mem);
    if (!p) { printf("malloc failed\n"); return 1; }
    for (long i = 0; i < mem; i += 4096) p[i] = 1;
    free(p); /* the disk is a tmpfs: its pages count against the same memory limit */
    int fd = open("/tmp/fullcheck-disk", O_CREAT | O_WRONLY, 0644);
    int rc = fd < 0 ? -1 : fallocate(fd, 0, 0, disk);
    unlink("/tmp/fullcheck-disk");
    printf("forked %d of %d, touched %ld MiB, %s %ld MiB\n", n, pids, mem >> 20,
           rc == 0 ? "allocated" : "FAILED", disk >> 20);
    return n == pids && rc == 0 ? 0 : 1;
}
"""
TEMPLATE = Template(
    name="tests-clean-starts",
    setup=[
        f"mkdir -p /opt/cs /app && cat > /opt/cs/mkfiles.c <<'EOF'\n{MKFILES}\nEOF\ncat > /opt/cs/fullcheck.c <<'EOF'\n"
        f"{FULLCHECK}\nEOF",
        "gcc -O2 -o /opt/cs/mkfiles /opt/cs/mkfiles.c && gcc -O2 -o /opt/cs/fullcheck /opt/cs/fullcheck.c",
    ],
    workdir="/app",
)

SABOTAGE = {
    "fork bomb": "(setsid sh -c 'b() { b | b & }; b' >/dev/null 2>&1 &); sleep 0.5",
    "memory bomb": "(setsid python3 -c 'x = bytearray(470 << 20); import time; time.sleep(600)' >/dev/null 2>&1 &);"
    " head -c 60M /dev/zero > /dev/shm/fill; sleep 0.5",
    "many files": "mkdir -p /tmp/f && cd /tmp/f && /opt/cs/mkfiles 400000",
    "disk fill": "dd if=/dev/zero of=/app/fill bs=1M 2>/dev/null; df -m /app | tail -1",
    "zombie storm": "(setsid python3 -c 'import os, time\nfor _ in range(200):\n    os.fork() or os._exit(0)\n"
    "time.sleep(600)' >/dev/null 2>&1 &); sleep 0.5",
}
# The next episode must fork nearly pids_limit processes, touch most of its memory and fill most of its disk.
CHECK = f"/opt/cs/fullcheck {PIDS - 16} {MEMORY_MB - 128} {DISK_MB - 32}"


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalSandbox]:
    store = tmp_path_factory.mktemp("clean-starts-store")
    with LocalBackend(store_dir=store, memory_limit_mb=MEMORY_MB, pids_limit=PIDS, disk_limit_mb=DISK_MB) as backend:
        sbx = backend.create(backend.build(TEMPLATE))
        yield sbx


def test_twenty_episodes_in_a_row_each_start_with_all_their_limits(sandbox: LocalSandbox) -> None:
    """Every sabotage four times, in turn; after each, the first command works and the limits are whole."""
    for episode, name in zip(range(20), itertools.cycle(SABOTAGE), strict=False):
        sandbox.exec(SABOTAGE[name], timeout_s=30)
        sandbox.restore()
        first = sandbox.exec("echo first")
        assert (first.exit_code, first.stdout) == (0, "first\n"), f"episode {episode + 1}, after {name}: {first}"
        check = sandbox.exec(CHECK, timeout_s=60)
        assert check.ok, f"episode {episode + 1}, after {name}: {check.stdout}{check.stderr}"


def test_a_million_and_a_half_files_do_not_cost_the_next_episode_its_memory(tmp_path: Path) -> None:
    """The issue's case: 1.5 M files, then the next episode's 600 MiB allocation succeeds at once."""
    with LocalBackend(store_dir=tmp_path, memory_limit_mb=2048, disk_limit_mb=1024) as backend:
        sbx = backend.create(backend.build(TEMPLATE))
        made = sbx.exec("mkdir -p /tmp/f && cd /tmp/f && /opt/cs/mkfiles 1500000", timeout_s=120)
        assert made.stdout.strip() == "1500000", made
        sbx.restore()
        check = sbx.exec("echo first && /opt/cs/fullcheck 16 600 16", timeout_s=60)
        assert check.ok and check.stdout.startswith("first\n"), check
