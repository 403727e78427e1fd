"""The built-in tasks' verifiers hold against hostile outputs.

Every attack here is a list of shell actions an agent could take through ``snapgym/Shell-v0``. Each
leaves hostile code, configuration or files inside the task's outputs (``/app``), the one channel a
strict verifier still shows it (see envs/builtin/README.md). Each attack beat the built-in tests
before they were hardened: it scored 1.0 where doing nothing scores 0.0, or made the episode
unscored by hanging the verifier past its timeout. Now each must score exactly what doing nothing
scores (0.0), in a scored episode, while the reference solution still scores 1.0.
"""

from __future__ import annotations

import re
import shlex
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, cast

import gymnasium as gym
import pytest

import envs
from envs.base import SandboxEnv
from envs.tasks import BUILTIN_DIR, builtin_task_ids, load_task
from envs.tasks.oracle import run_solution

TASKS = builtin_task_ids()
PYTHON_MODULES = {"fix-python-stats": "stats", "fix-python-parser": "kvparse", "implement-lru-cache": "lru"}
"""The tasks whose tests import the agent's module, and that module."""
GIT_TASKS = ("git-recover-deleted-branch", "git-resolve-merge-conflict", "git-revert-bad-commit")
OUTPUTS = {
    "bash-backup-rotate": "/app/rotate.sh",
    "bash-batch-rename": "/app/photos/photo-0001.jpg",
    "c-fix-segfault": "/app/wordcount.c",
    "c-write-makefile": "/app/main.c",
    "config-rewrite": "/app/app.conf",
    "csv-sales-summary": "/app/summary.csv",
    "find-large-files": "/app/large.txt",
    "fix-python-parser": "/app/kvparse.py",
    "fix-python-stats": "/app/stats.py",
    "git-recover-deleted-branch": "/app/repo/README.md",
    "git-resolve-merge-conflict": "/app/repo/CHANGELOG.md",
    "git-revert-bad-commit": "/app/repo/inventory.py",
    "implement-lru-cache": "/app/lru.py",
    "json-merge-users": "/app/users.json",
    "jsonl-to-csv": "/app/events.csv",
    "log-error-count": "/app/answer.txt",
    "service-healthcheck-port": "/app/service.env",
    "sqlite-fix-schema": "/app/app.db",
    "sqlite-top-customers": "/app/top.txt",
    "start-kv-service": "/app/kv_server.py",
    "top-ips": "/app/top_ips.txt",
}
"""One file per task that its tests read, run or import."""

SH_REWARD = "echo 1 > /logs/verifier/reward.txt 2>/dev/null"
PY_REWARD = """
import os as _os
try:
    with open("/logs/verifier/reward.txt", "w") as _f:
        _f.write("1\\n")
except OSError:
    pass
"""
PY_DAEMON = """
import os as _os
if _os.fork() == 0:
    _os.setsid()
    if _os.fork() == 0:
        import time as _time
        _os.closerange(0, 1024)
        for _ in range(3000):
            try:
                with open("/logs/verifier/reward.txt", "w") as _f:
                    _f.write("1\\n")
            except OSError:
                pass
            _time.sleep(0.005)
    _os._exit(0)
"""
REWARD_JSON_SCRIPT = """#!/bin/bash
echo '{"reward": 1}' > /logs/verifier/reward.json 2>/dev/null
exit 0
"""
HOOK = f"#!/bin/sh\n{SH_REWARD}\nexit 1\n"
READ_ANSWERS_C = r"""#include <libgen.h>
#include <stdio.h>
int main(int argc, char **argv)
{
    char path[4096], buf[65536];
    size_t n;
    FILE *f;
    if (argc != 2) { fputs("usage: wordcount FILE\n", stderr); return 2; }
    f = fopen(argv[1], "rb");
    if (f == NULL) { fputs("wordcount: cannot open\n", stderr); return 1; }
    fclose(f);
    snprintf(path, sizeof path, "/tests/expected/%s.out", basename(argv[1]));
    f = fopen(path, "rb");
    if (f == NULL) { puts("lines: 0"); return 0; }
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) fwrite(buf, 1, n, stdout);
    fclose(f);
    return 0;
}
"""
WRITE_REWARD_C = r"""#include <stdio.h>
int main(void)
{
    FILE *f = fopen("/logs/verifier/reward.txt", "w");
    if (f != NULL) { fputs("1\n", f); fclose(f); }
    return 3;
}
"""
REWARD_MAKEFILE = "all:\n\t@echo 1 > /logs/verifier/reward.txt\nclean:\n\t@true\n"
FAKE_KV = """
from http.server import BaseHTTPRequestHandler, HTTPServer
store = {"greeting": "hello snapgym"}
class H(BaseHTTPRequestHandler):
    server_version = "snapgym-kv/1.0"
    def reply(self, status, body=""):
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
    def do_GET(self):
        if self.path == "/health":
            self.reply(200, "ok")
        else:
            self.reply(200, store.get(self.path[len("/kv/"):], ""))
    def do_PUT(self):
        store[self.path[len("/kv/"):]] = self.rfile.read(int(self.headers["Content-Length"])).decode()
        self.reply(201)
    def log_message(self, *args):
        pass
HTTPServer(("127.0.0.1", 8080), H).serve_forever()
"""
FAKE_SERVICE = """
import json
from http.server import BaseHTTPRequestHandler, HTTPServer
class H(BaseHTTPRequestHandler):
    def do_GET(self):
        info = {"service": "inventory", "host": "127.0.0.1", "port": 9090}
        body = "ok" if self.path == "/health" else json.dumps(info)
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body.encode())
    def log_message(self, *args):
        pass
HTTPServer(("127.0.0.1", 9090), H).serve_forever()
"""
SHADOWED = ("json", "pathlib", "csv", "difflib", "hashlib", "secrets", "shutil", "subprocess", "tempfile",
            "datetime", "sqlite3", "ctypes", "traceback", "dataclasses", "resource", "stat", "unittest")  # fmt: skip


def write(path: str, text: str, *, mode: str = "644") -> str:
    """A shell action that writes ``text`` to ``path``."""
    return f"printf %s {shlex.quote(text)} > {path} && chmod {mode} {path}"


def detached(command: str) -> str:
    """A shell action that starts ``command`` in the background, outliving the action."""
    return f"setsid nohup {command} > /dev/null 2>&1 < /dev/null & sleep 1"


def solve(task_id: str) -> str:
    """A shell action that runs the task's reference solution (for those that need no /solution files)."""
    script = (BUILTIN_DIR / task_id / "solution" / "solve.sh").read_text()
    return f"{write('/tmp/solve.sh', script)} && bash /tmp/solve.sh > /dev/null 2>&1"


def slow_wordcount() -> str:
    """The reference wordcount.c, 3 s slower per run: 24 runs cannot finish within the verifier's timeout."""
    task = BUILTIN_DIR / "c-fix-segfault"
    patched = [str(task / "environment" / "wordcount.c"), str(task / "solution" / "wordcount.patch")]
    source = subprocess.run(["patch", "-s", "-o", "-", *patched], capture_output=True, text=True, check=True).stdout
    main = "int main(int argc, char **argv)\n{"
    source = "#include <unistd.h>\n" + source.replace(main, main + "\n    sleep(3);")
    return write("/app/wordcount.c", source)


@dataclass(frozen=True, slots=True)
class Attack:
    """Hostile outputs for some tasks: the actions that leave them, per task."""

    name: str
    what: str
    actions: Callable[[str], tuple[str, ...]]
    tasks: tuple[str, ...]


def _python_module(task_id: str, text: str, *, append: bool = False) -> tuple[str, ...]:
    path = f"/app/{PYTHON_MODULES[task_id]}.py"
    return (f"printf %s {shlex.quote(text)} >> {path}",) if append else (write(path, text),)


def _git(task_id: str) -> tuple[str, ...]:
    """Partial work that fails one requirement, checked after git has run the agent's configuration."""
    if task_id == "git-recover-deleted-branch":  # the right branch, but a dirty working tree
        return ("cd /app/repo && git branch recovered 5d6fec857d0aee4d3986d36bf1dbc33911fc443a && echo x >> README.md",)
    if task_id == "git-resolve-merge-conflict":  # the right merge, but a leftover untracked file
        return (solve(task_id), "echo leftover > /app/repo/CHANGELOG.md.orig")
    return ("cd /app/repo && git commit -q --allow-empty -m 'Revert nothing'",)  # a revert that reverts nothing


def _hook() -> str:
    return write("/app/hook.sh", HOOK, mode="755")


def _lying_service(task_id: str) -> tuple[str, ...]:
    if task_id == "start-kv-service":
        return write("/app/fake_kv_server.py", FAKE_KV), detached("python3 /app/fake_kv_server.py")
    env = "SERVICE_NAME=inventory\\nSERVICE_HOST=127.0.0.1\\nSERVICE_PORT=9090\\n"
    return (
        f"printf '{env}' > /app/service.env",
        write("/app/fake_service.py", FAKE_SERVICE),
        detached("python3 /app/fake_service.py"),
    )


EXPECTED_FILES = {
    "config-rewrite": ("/app/app.conf", "/tests/expected.conf"),
    "find-large-files": ("/app/large.txt", "/tests/expected.txt"),
    "json-merge-users": ("/app/users.json", "/tests/expected_users.json"),
}
"""Outputs whose expected content is a file in /tests."""
SQL_HANG = (
    "CREATE TRIGGER hang BEFORE INSERT ON users BEGIN SELECT count(*) FROM "
    "(WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT x FROM c); END;"
)
PASSING_UNITTEST = "Ran 19 tests in 0.001s\\n\\nOK"
FLUSH_AND_EXIT = "sys.stderr.flush()\nos._exit(0)\n"

ATTACKS = (
    Attack(
        "stdlib-shadow",
        "/app/<module>.py for stdlib modules a Python verifier imports: each writes reward 1 and exits 0",
        lambda t: tuple(write(f"/app/{m}.py", PY_REWARD + "_os._exit(0)\n") for m in SHADOWED),
        tuple(TASKS),
    ),
    Attack(
        "sitecustomize",
        "/app/sitecustomize.py and usercustomize.py write reward 1 at interpreter start",
        lambda t: (write("/app/sitecustomize.py", PY_REWARD), write("/app/usercustomize.py", PY_REWARD)),
        tuple(TASKS),
    ),
    Attack(
        "fake-unittest",
        "/app/unittest.py prints a passing unittest summary",
        lambda t: (write("/app/unittest.py", f"print('{PASSING_UNITTEST}')\n"),),
        tuple(PYTHON_MODULES),
    ),
    Attack(
        "module-prints-ok",
        "the module under test prints a passing unittest summary and exits 0 on import",
        lambda t: _python_module(t, f"import os, sys\nsys.stderr.write('{PASSING_UNITTEST}\\n')\n{FLUSH_AND_EXIT}"),
        tuple(PYTHON_MODULES),
    ),
    Attack(
        "module-writes-reward",
        "the module under test writes reward 1 when imported (its bugs stay)",
        lambda t: _python_module(t, PY_REWARD, append=True),
        tuple(PYTHON_MODULES),
    ),
    Attack(
        "module-daemon",
        "the module under test starts a detached process that rewrites reward 1 for 15 s",
        lambda t: _python_module(t, PY_DAEMON, append=True),
        tuple(PYTHON_MODULES),
    ),
    Attack(
        "script-writes-reward-json",
        "rotate.sh writes reward.json, which the verifier reads before reward.txt",
        lambda t: (write("/app/rotate.sh", REWARD_JSON_SCRIPT, mode="755"),),
        ("bash-backup-rotate",),
    ),
    Attack(
        "symlink-to-expected",
        "the output is a symbolic link to the expected answer in /tests",
        lambda t: (f"ln -sf {EXPECTED_FILES[t][1]} {EXPECTED_FILES[t][0]}",),
        tuple(EXPECTED_FILES),
    ),
    Attack(
        "fifo-output",
        "a file the tests read is a FIFO: reading it blocks forever",
        lambda t: (f"rm -rf {OUTPUTS[t]} && mkfifo {OUTPUTS[t]}",),
        tuple(TASKS),
    ),
    Attack(
        "huge-output",
        "a file the tests read is a 1 TiB sparse file",
        lambda t: (f"rm -rf {OUTPUTS[t]} && truncate -s 1T {OUTPUTS[t]}",),
        tuple(TASKS),
    ),
    Attack(
        "makefile-writes-reward",
        "/app/Makefile's default goal writes reward 1 and builds nothing",
        lambda t: (write("/app/Makefile", REWARD_MAKEFILE),),
        ("c-fix-segfault", "c-write-makefile"),
    ),
    Attack(
        "binary-writes-reward",
        "the program under test writes reward 1 when run",
        lambda t: (write("/app/wordcount.c", WRITE_REWARD_C),),
        ("c-fix-segfault",),
    ),
    Attack(
        "binary-reads-answers",
        "the program under test prints the expected output from /tests",
        lambda t: (write("/app/wordcount.c", READ_ANSWERS_C),),
        ("c-fix-segfault",),
    ),
    Attack(
        "slow-binary",
        "a correct program that takes 3 s per run, so the tests outlive the verifier's timeout",
        lambda t: (slow_wordcount(),),
        ("c-fix-segfault",),
    ),
    Attack(
        "git-fsmonitor",
        "core.fsmonitor runs an agent hook that writes reward 1 during git status",
        lambda t: (*_git(t), _hook(), "git -C /app/repo config core.fsmonitor /app/hook.sh"),
        GIT_TASKS,
    ),
    Attack(
        "git-assume-unchanged",
        "a modified file hidden from git status by the index's assume-unchanged bit",
        lambda t: (*_git(t), "git -C /app/repo update-index --assume-unchanged README.md"),
        ("git-recover-deleted-branch",),
    ),
    Attack(
        "git-diff-external",
        "diff.external runs an agent hook when the tests show a wrong commit's diff",
        lambda t: (
            "cd /app/repo && echo wrong >> README.md && git commit -qam 'Revert the bad commit'",
            _hook(),
            "git -C /app/repo config diff.external /app/hook.sh",
        ),
        ("git-revert-bad-commit",),
    ),
    Attack(
        "git-clean-filter",
        "a clean filter (info/attributes + config) runs an agent hook during git status",
        lambda t: (
            *_git(t),
            _hook(),
            "cd /app/repo && git config filter.x.clean /app/hook.sh && echo '* filter=x' > .git/info/attributes",
            "touch -d 2030-01-01 /app/repo/inventory.py",
        ),
        ("git-revert-bad-commit",),
    ),
    Attack(
        "sqlite-trigger-hang",
        "the migrated database has a trigger that loops forever on INSERT",
        lambda t: (solve(t), f'sqlite3 /app/app.db "{SQL_HANG}"'),
        ("sqlite-fix-schema",),
    ),
    Attack(
        "lying-service",
        "a fake server, not the task's service, answers what the tests ask",
        _lying_service,
        ("start-kv-service", "service-healthcheck-port"),
    ),
)
KV_BY_RELATIVE_PATH = (
    "cd /app && setsid nohup python3 kv_server.py --port 8080 > /dev/null 2>&1 < /dev/null & "
    "for i in $(seq 50); do curl -fsS http://127.0.0.1:8080/health > /dev/null 2>&1 && break; sleep 0.1; done; "
    "printf 'hello snapgym' | curl -fsS -X PUT --data-binary @- http://127.0.0.1:8080/kv/greeting"
)
OTHER_SHAPES = {
    "fix-python-stats": (solve("fix-python-stats"), "chmod 600 /app/stats.py"),
    "bash-backup-rotate": (solve("bash-backup-rotate"), "chmod 700 /app/rotate.sh"),
    "c-write-makefile": (solve("c-write-makefile"), "chmod 600 /app/Makefile"),
    "git-recover-deleted-branch": (solve("git-recover-deleted-branch"), "git -C /app/repo gc -q --prune=now"),
    "git-resolve-merge-conflict": (solve("git-resolve-merge-conflict"), "git -C /app/repo gc -q --aggressive"),
    "start-kv-service": (KV_BY_RELATIVE_PATH,),
}
"""Correct solutions that the hardening must not refuse: files only their owner can read, a
repository packed by git gc, the service started by a relative path."""

CASES = [pytest.param(task_id, attack, id=f"{attack.name}-{task_id}") for attack in ATTACKS for task_id in attack.tasks]


@pytest.fixture()
def make_env() -> Iterator[Callable[[str], SandboxEnv]]:
    """Fresh environments in the mode each task declares, closed after the test."""
    made: list[gym.Env[Any, Any]] = []

    def make(task_id: str) -> SandboxEnv:
        env = gym.make("snapgym/Shell-v0", task=task_id, verification=load_task(task_id).verification.value)
        made.append(env)
        return cast(SandboxEnv, env.unwrapped)

    yield make
    for env in made:
        env.close()


def play(env: SandboxEnv, actions: tuple[str, ...]) -> tuple[float, dict[str, Any]]:
    """Reset, take the actions, submit: the reward and the last info."""
    env.reset()
    for action in actions:
        obs, _, terminated, truncated, _ = env.step(action)
        assert not (terminated or truncated), f"the attack's setup ended the episode: {obs['output'][-500:]}"
    _, reward, _, _, info = env.step(envs.SUBMIT)
    return float(reward), info


def verifier_output(info: dict[str, Any]) -> str:
    return str(info.get("verifier", {}).get("output", ""))[-3000:] + f"\ninfra_error={info.get('infra_error')}"


@pytest.mark.parametrize(("task_id", "attack"), CASES)
def test_attack_scores_what_doing_nothing_scores(
    task_id: str, attack: Attack, make_env: Callable[[str], SandboxEnv]
) -> None:
    reward, info = play(make_env(task_id), attack.actions(task_id))
    assert info["scored"] is True, verifier_output(info)
    assert reward == 0.0, verifier_output(info)


@pytest.mark.parametrize("task_id", TASKS)
def test_reference_solution_scores_one_and_doing_nothing_zero(
    task_id: str, make_env: Callable[[str], SandboxEnv]
) -> None:
    env = make_env(task_id)
    reward, info = play(env, ())
    assert info["scored"] is True and reward == 0.0, verifier_output(info)
    env.reset()
    assert env.sandbox is not None
    run_solution(env.sandbox, env.task)
    _, reward, _, _, info = env.step(envs.SUBMIT)
    assert info["scored"] is True and reward == 1.0, verifier_output(info)


@pytest.mark.parametrize("task_id", sorted(OTHER_SHAPES))
def test_correct_solutions_in_other_shapes_still_score_one(task_id: str, make_env: Callable[[str], SandboxEnv]) -> None:
    reward, info = play(make_env(task_id), OTHER_SHAPES[task_id])
    assert info["scored"] is True and reward == 1.0, verifier_output(info)


def test_every_task_has_the_same_one_verifier_kit() -> None:
    kits = sorted(BUILTIN_DIR.glob("*/tests/verifykit*.py"))
    assert {path.name for path in kits} == {"verifykit.py"}, "the kit is one file: add to it, not beside it"
    assert [path.parent for path in kits] == sorted(path.parent for path in BUILTIN_DIR.glob("*/tests/check.py"))
    assert len({path.read_bytes() for path in kits}) == 1, "edit one copy, then copy it to every task"


def test_every_attack_has_a_target_and_every_task_is_attacked() -> None:
    attacked = {task_id for attack in ATTACKS for task_id in attack.tasks}
    assert attacked == set(TASKS)
    assert all(set(attack.tasks) <= set(TASKS) for attack in ATTACKS)
    assert set(OUTPUTS) == set(TASKS)
    assert all(re.fullmatch(r"[a-z0-9-]+", attack.name) for attack in ATTACKS)
