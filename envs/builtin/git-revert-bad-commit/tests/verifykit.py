"""verifykit: judge outputs an adversary may have written, without trusting them.

Identical copies live in the tests/ of the built-in tasks (tests/ is all that reaches /tests);
snapgym's tests/verifier/test_builtin_verifiers.py keeps them identical. envs/builtin/README.md explains
the rules these helpers implement. A check script runs as ``python3 -I /tests/check.py``:

    import sys
    sys.path.insert(0, "/tests")
    import verifykit as vk

    def check() -> None:
        ...  # raise vk.Failure("why") at the first requirement that is not met

    vk.main(check, budget_s=45)

main() makes this process hard to reach (not dumpable, /tests and the reward folder private to
root), runs check() within a time budget, kills every process agent code left behind, and only
then writes the reward, 1 or 0, in both cases. Agent code runs only through run_untrusted():
in a child process, as a user that owns nothing (UNTRUSTED_UID), without privileges, with limits
and a timeout, so it can neither write the reward, nor read /tests, nor signal or trace this one.

Two more sections serve some tasks only. Git: Repo asks git about the agent's repository without
running anything the repository says to run. Services: http_request(), listening_pids() and
require_python_service() check a server the agent started, believing nothing a correct one would
not say.
"""

from __future__ import annotations

import contextlib
import ctypes
import http.client
import json
import os
import resource
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass

UNTRUSTED_UID = 61111
"""Agent code runs as this user and group: no file in an image belongs to it."""
REWARD_DIR = "/logs/verifier"
TESTS_DIR = "/tests"
SAFE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
MAX_OUTPUT_BYTES = 1 << 20

_PR_SET_PDEATHSIG, _PR_SET_DUMPABLE, _PR_SET_CHILD_SUBREAPER, _PR_SET_NO_NEW_PRIVS = 1, 4, 36, 38
_deadline = float("inf")
_can_drop: bool | None = None
_scratch: list[str] = []


class Failure(Exception):
    """A requirement is not met; the message says which."""


class _Missing(Failure):
    """A path the agent was to leave does not exist."""


@dataclass(frozen=True)
class Result:
    """What a child process did."""

    returncode: int
    """The exit status; negative: killed by that signal (-9 after a timeout)."""
    stdout: bytes
    stderr: bytes
    timed_out: bool
    duration_s: float

    def text(self, limit: int = 2000) -> str:
        """stdout and stderr, decoded and cut to their last ``limit`` characters, for messages."""
        return (self.stdout + self.stderr).decode("utf-8", "replace")[-limit:]


# -- the checker's life ---------------------------------------------------------------------------


def main(check: Callable[[], None], *, budget_s: float) -> None:
    """Run ``check`` and write the reward: 1 if it returned, 0 if it failed, crashed or ran out of time."""
    global _deadline
    harden()
    _deadline = time.monotonic() + budget_s
    signal.signal(signal.SIGALRM, _out_of_time)
    signal.setitimer(signal.ITIMER_REAL, budget_s)
    reward = 0
    try:
        check()
        reward = 1
    except Failure as exc:
        reward = 0
        print(f"FAIL: {exc}")
    except BaseException:  # a crash of the checker on hostile input is a failed check, never a pass
        reward = 0
        traceback.print_exc(file=sys.stdout)
        print("FAIL: the checker stopped on an unexpected error")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        try:
            kill_untrusted()  # nothing the agent started may outlive the verdict
        except Failure as exc:
            reward = 0
            print(f"FAIL: {exc}")
        for path in _scratch:
            shutil.rmtree(path, ignore_errors=True)
        write_reward(reward)
    if reward:
        print("PASS")
    sys.stdout.flush()
    os._exit(0)


def harden() -> None:
    """Make this process unreachable for agent code, and /tests and the reward folder private."""
    _prctl(_PR_SET_DUMPABLE, 0)  # no ptrace, no /proc/PID/mem, even for processes of this user
    _prctl(_PR_SET_CHILD_SUBREAPER, 1)  # orphans of agent code become our children, to kill and reap
    os.umask(0o077)
    os.chdir("/")
    if os.geteuid() == 0:
        for path in (TESTS_DIR, REWARD_DIR):
            _make_private(path)


def seconds_left() -> float:
    """Time left of the budget main() was given."""
    return _deadline - time.monotonic()


def write_reward(value: float) -> None:
    """Write reward.txt (in one rename) and remove any reward.json, which the verifier would read first.

    Should the disk be full, the file is overwritten in place, or at worst removed: a missing
    reward makes the episode unscored, never scored with a reward that is not this one.
    """
    os.makedirs(REWARD_DIR, exist_ok=True)
    target = os.path.join(REWARD_DIR, "reward.txt")
    _remove(os.path.join(REWARD_DIR, "reward.json"))
    if os.path.isdir(target) and not os.path.islink(target):
        shutil.rmtree(target)
    data = f"{value:g}\n".encode()
    temporary = os.path.join(REWARD_DIR, f".reward-{os.getpid()}")
    try:
        _remove(temporary)
        _write_file(temporary, data, os.O_CREAT | os.O_EXCL)
        os.replace(temporary, target)
    except OSError:
        _remove(temporary)
        try:
            _write_file(target, data, os.O_CREAT | os.O_TRUNC | os.O_NONBLOCK)
        except OSError:
            _remove(target)
            raise


def _write_file(path: str, data: bytes, flags: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | flags, 0o644)
    try:
        if os.write(fd, data) != len(data):
            raise OSError(f"short write to {path}")
        os.fchmod(fd, 0o644)
    finally:
        os.close(fd)


def _out_of_time(signum: int, frame: object) -> None:
    raise Failure("the checks ran out of time")


def _make_private(path: str) -> None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        os.chown(path, 0, 0, follow_symlinks=False)
        os.chmod(path, 0o700)


def _remove(path: str) -> None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(path)
    else:
        os.unlink(path)


def _prctl(option: int, value: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(option, value, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), f"prctl({option}, {value}) failed")


# -- reading what the agent left ------------------------------------------------------------------


def read_output(path: str, *, max_bytes: int = MAX_OUTPUT_BYTES) -> bytes:
    """The bytes of a regular file the agent wrote.

    Opened without following a symbolic link anywhere on the path, without blocking on a FIFO,
    and refused when larger than ``max_bytes``.
    """
    fd = _open_nofollow(path)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Failure(f"{path} is not a regular file")
        if st.st_size > max_bytes:
            raise Failure(f"{path} is larger than {max_bytes} bytes")
        chunks, total = [], 0
        while total <= max_bytes:
            chunk = os.read(fd, min(1 << 16, max_bytes + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        if total > max_bytes:
            raise Failure(f"{path} is larger than {max_bytes} bytes")
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_text(path: str, *, max_bytes: int = MAX_OUTPUT_BYTES) -> str:
    """read_output() decoded as UTF-8; invalid UTF-8 is a Failure."""
    try:
        return read_output(path, max_bytes=max_bytes).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise Failure(f"{path} is not UTF-8 text: {exc}") from None


def lstat_output(path: str) -> os.stat_result | None:
    """os.lstat() of a path whose every directory is a real directory, or None when it is missing."""
    parent, name = os.path.split(os.path.normpath(path))
    try:
        fd = _open_nofollow(parent, directory=True)
    except _Missing:
        return None
    try:
        return os.lstat(name, dir_fd=fd)
    except FileNotFoundError:
        return None
    finally:
        os.close(fd)


def remove_output(path: str) -> None:
    """Remove what the agent left at ``path`` (a file, link, FIFO or folder), following no link."""
    if lstat_output(path) is not None:
        _remove(path)


def walk_output(root: str, *, max_entries: int = 10_000) -> dict[str, os.stat_result]:
    """Every entry under ``root`` (relative path -> lstat), never following a symbolic link."""
    st = lstat_output(root)
    if st is None or not stat.S_ISDIR(st.st_mode):
        raise Failure(f"{root} is not a directory")
    found: dict[str, os.stat_result] = {}
    pending = [""]
    while pending:
        relative = pending.pop()
        with os.scandir(os.path.join(root, relative) if relative else root) as entries:
            for entry in entries:
                path = os.path.join(relative, entry.name) if relative else entry.name
                found[path] = entry.stat(follow_symlinks=False)
                if len(found) > max_entries:
                    raise Failure(f"{root} holds more than {max_entries} entries")
                if entry.is_dir(follow_symlinks=False):
                    pending.append(path)
    return found


def _open_nofollow(path: str, *, directory: bool = False) -> int:
    parts = [p for p in os.path.normpath(path).split("/") if p]
    if not path.startswith("/"):
        raise ValueError(f"not an absolute path: {path}")
    fd = os.open("/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for index, part in enumerate(parts):
            last = index == len(parts) - 1
            flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
            flags |= os.O_DIRECTORY if directory or not last else os.O_NONBLOCK | os.O_NOCTTY
            try:
                next_fd = os.open(part, flags, dir_fd=fd)
            except FileNotFoundError:
                raise _Missing(f"{path} is missing") from None
            except OSError as exc:  # ELOOP: a symbolic link; ENOTDIR: a file where a folder should be
                what = "leads through a symbolic link or a non-directory" if not last else "cannot be opened"
                raise Failure(f"{path} {what} ({os.strerror(exc.errno or 0)})") from None
            os.close(fd)
            fd = next_fd
        return fd
    except BaseException:
        os.close(fd)
        raise


# -- running agent code ---------------------------------------------------------------------------


def can_drop_privileges() -> bool:
    """Whether children can run as UNTRUSTED_UID (we are root and the sandbox maps that user)."""
    global _can_drop
    if _can_drop is None:
        _can_drop = os.geteuid() == 0 and _try_in_child(lambda: _become(UNTRUSTED_UID))
        if _can_drop:
            kill_untrusted()  # a process of that user that was there before us could trace our children
        else:
            print(f"verifykit: cannot run agent code as uid {UNTRUSTED_UID}; it runs as uid {os.geteuid()}, "
                  "which can reach the reward channel (see envs/builtin/README.md)")  # fmt: skip
    return _can_drop


def run_untrusted(
    argv: Sequence[str],
    *,
    cwd: str,
    timeout_s: float,
    stdin: bytes = b"",
    env: dict[str, str] | None = None,
    max_output_bytes: int = MAX_OUTPUT_BYTES,
    max_file_bytes: int = 64 << 20,
) -> Result:
    """Run agent code (or anything that runs it) and wait for it and everything it started.

    It runs as UNTRUSTED_UID without privileges (no setuid, no file capabilities), in its own
    session, first in line for the OOM killer, with limits on processes and file sizes, and is
    killed with all its descendants at ``timeout_s`` or when the budget runs out. Only
    ``SAFE_PATH``, a fresh ``HOME`` and ``TMPDIR``, a C locale and ``env`` reach it.
    """
    drop = can_drop_privileges()
    home = untrusted_dir()

    def enter() -> None:
        try:
            with open("/proc/self/oom_score_adj", "w") as f:
                f.write("1000")
        except OSError:
            pass
        for limit, value in ((resource.RLIMIT_CORE, 0), (resource.RLIMIT_FSIZE, max_file_bytes),
                             (resource.RLIMIT_NPROC, 256), (resource.RLIMIT_NOFILE, 1024)):  # fmt: skip
            _lower_limit(limit, value)
        if drop:
            _become(UNTRUSTED_UID)
        _prctl(_PR_SET_NO_NEW_PRIVS, 1)
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)

    base = {"PATH": SAFE_PATH, "HOME": home, "TMPDIR": home, "LC_ALL": "C", "LANG": "C"}
    try:
        return _run(argv, cwd=cwd, timeout_s=timeout_s, stdin=stdin, env={**base, **(env or {})},
                    max_output_bytes=max_output_bytes, preexec=enter)  # fmt: skip
    finally:
        kill_untrusted()


def run_trusted(
    argv: Sequence[str],
    *,
    cwd: str = "/",
    timeout_s: float,
    env: dict[str, str] | None = None,
    max_output_bytes: int = MAX_OUTPUT_BYTES,
) -> Result:
    """Run a trusted tool (from the known-good image) on agent data, with a timeout and output caps."""

    def enter() -> None:
        _lower_limit(resource.RLIMIT_CORE, 0)
        _lower_limit(resource.RLIMIT_FSIZE, max_output_bytes * 4)

    full_env = {"PATH": os.environ.get("PATH") or SAFE_PATH, "LC_ALL": "C", "LANG": "C", **(env or {})}
    return _run(argv, cwd=cwd, timeout_s=timeout_s, stdin=b"", env=full_env,
                max_output_bytes=max_output_bytes, preexec=enter)  # fmt: skip


def run_python(code: str, payload: object, *, path: str, timeout_s: float) -> object:
    """Run Python ``code`` that uses agent modules in an untrusted child; return what it reported.

    The child is ``python3 -I -B`` with ``path`` appended to sys.path (after the standard
    library); ``path`` and the modules directly in it are made readable for it. ``code`` finds
    ``payload`` (JSON-ready) in ``PAYLOAD`` and ends with ``report(result)``; whatever the agent's
    code prints goes to stderr. The report is data from an untrusted process: compare it with
    what is expected; never execute it.
    """
    let_untrusted_read(path)
    for name in sorted(os.listdir(path)):
        if name.endswith(".py"):
            let_untrusted_read(os.path.join(path, name))
    prelude = (
        "import json as _json, os as _os, sys as _sys\n"
        "_fd = _os.dup(1)\n_os.dup2(2, 1)\n"
        f"_sys.path.append({path!r})\n"
        "PAYLOAD = _json.loads(_sys.stdin.buffer.read())\n"
        "def report(result):\n"
        "    data = _json.dumps(result).encode()\n"
        "    while data:\n"
        "        data = data[_os.write(_fd, data):]\n"
        "    _os._exit(0)\n"
    )
    box = untrusted_dir()
    result = run_untrusted(["python3", "-I", "-B", "-c", prelude + code], cwd=box, timeout_s=timeout_s,
                           stdin=json.dumps(payload).encode())  # fmt: skip
    if result.timed_out:
        raise Failure(f"the code under test did not finish within {timeout_s:g} s")
    if result.returncode != 0 or not result.stdout:
        raise Failure(f"the code under test failed (exit status {result.returncode}):\n{result.text()}")
    try:
        return json.loads(result.stdout)
    except ValueError:
        raise Failure("the code under test reported something that is not JSON") from None


def untrusted_dir() -> str:
    """A fresh, empty folder that only the untrusted user (and root) can use; removed at the end."""
    path = private_dir()
    if can_drop_privileges():
        os.chown(path, UNTRUSTED_UID, UNTRUSTED_UID)
    return path


def private_dir() -> str:
    """A fresh folder only root can use; removed at the end."""
    path = tempfile.mkdtemp(prefix="verifykit-")
    _scratch.append(path)
    return path


def give_to_untrusted(path: str) -> None:
    """Let agent code write at ``path`` (a file or folder the agent wrote, never followed if a link)."""
    if can_drop_privileges():
        os.chown(path, UNTRUSTED_UID, UNTRUSTED_UID, follow_symlinks=False)


def let_untrusted_read(path: str) -> None:
    """Add read (and, for a folder, search) permission for others to what the agent left at ``path``.

    For outputs that agent code run as the untrusted user must read, whatever umask wrote them.
    A symbolic link is left alone (and followed, when used, with the untrusted user's rights).
    """
    st = lstat_output(path)
    if st is not None and (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
        os.chmod(path, stat.S_IMODE(st.st_mode) | (0o005 if stat.S_ISDIR(st.st_mode) else 0o004))


def kill_untrusted() -> None:
    """Kill every process of the untrusted user (or, without one, every descendant) and reap them."""
    for _ in range(200):
        victims = _processes(uid=UNTRUSTED_UID) if can_drop_privileges() else _descendants()
        if not victims:
            return
        if can_drop_privileges():
            _try_in_child(lambda: (_become(UNTRUSTED_UID), os.kill(-1, signal.SIGKILL)))
        else:
            for pid in victims:
                _signal(pid, signal.SIGKILL)
        _reap()
        time.sleep(0.005)
    raise Failure("processes of the code under test could not be killed")


def _run(argv: Sequence[str], *, cwd: str, timeout_s: float, stdin: bytes, env: dict[str, str],
         max_output_bytes: int, preexec: Callable[[], None]) -> Result:  # fmt: skip
    limit_s = min(timeout_s, seconds_left() - 1)
    if limit_s <= 0:
        raise Failure("the checks ran out of time")
    with tempfile.TemporaryFile() as fin, tempfile.TemporaryFile() as fout, tempfile.TemporaryFile() as ferr:
        fin.write(stdin)
        fin.seek(0)
        started = time.monotonic()
        child = subprocess.Popen(list(argv), stdin=fin, stdout=fout, stderr=ferr, cwd=cwd, env=env,
                                 start_new_session=True, preexec_fn=preexec)  # fmt: skip
        timed_out = False
        try:
            child.wait(timeout=limit_s)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            if child.returncode is None:
                _signal(-child.pid, signal.SIGKILL)
                child.wait()
        duration = time.monotonic() - started
        if timed_out and limit_s < timeout_s:
            raise Failure("the checks ran out of time")
        outputs = []
        for f in (fout, ferr):
            f.seek(0)
            outputs.append(f.read(max_output_bytes))
    return Result(child.returncode, outputs[0], outputs[1], timed_out, duration)


def _lower_limit(limit: int, value: int) -> None:
    _, hard = resource.getrlimit(limit)
    value = value if hard == resource.RLIM_INFINITY else min(value, hard)
    resource.setrlimit(limit, (value, value))


def _become(uid: int) -> None:
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)


def _try_in_child(action: Callable[[], object]) -> bool:
    pid = os.fork()
    if pid == 0:
        try:
            action()
            os._exit(0)
        except BaseException:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    return os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


def _processes(*, uid: int) -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/status") as f:
                    fields = dict(line.split(":", 1) for line in f if ":" in line)
            except OSError:
                continue
            if int(fields.get("Uid", "-1").split()[0]) == uid and not fields.get("State", "").strip().startswith("Z"):
                found.append(int(name))
    return found


def _descendants() -> list[int]:
    parents: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if fields[0] != "Z":
                parents[int(name)] = int(fields[1])
    ours, me = [], os.getpid()
    for pid in parents:
        seen, current = set(), pid
        while current in parents and current not in seen and current != me:
            seen.add(current)
            current = parents[current]
        if current == me and pid != me:
            ours.append(pid)
    return ours


def _reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _signal(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


# -- git: a repository the agent left -------------------------------------------------------------
#
# Git runs commands named in a repository's own files: core.fsmonitor, diff.external, textconv and
# filter drivers, hooks, replace refs that swap objects, an index whose bits hide changes from
# ``git status``. So git never sees the agent's .git: Repo copies only its objects, refs, HEAD and
# index into a private folder (a symbolic link or special file there is a failure), gives the copy
# a fixed configuration and runs git as root on that copy, with no system or global configuration,
# no replace objects, hooks off. The working tree is judged against a fresh index built from HEAD,
# so every file is hashed; nothing the agent's index says about it is believed.

_GIT_COPIED = ("HEAD", "MERGE_HEAD", "CHERRY_PICK_HEAD", "REVERT_HEAD", "ORIG_HEAD", "index", "packed-refs")
_GIT_COPIED_DIRS = ("refs", "objects")
_GIT_MAX_FILE_BYTES = 16 << 20
_GIT_CONFIG = "[core]\n\trepositoryformatversion = 0\n\tfilemode = true\n\tbare = false\n"


class Repo:
    """A private, neutralised copy of the repository whose working tree is ``worktree``."""

    def __init__(self, worktree: str, *, max_bytes: int = 64 << 20, max_entries: int = 20_000) -> None:
        self.worktree = worktree
        self.agent_git_dir = os.path.join(worktree, ".git")
        st = lstat_output(self.agent_git_dir)
        if st is None or not stat.S_ISDIR(st.st_mode):
            raise Failure(f"{self.agent_git_dir} is not a directory")
        for name in ("commondir", "objects/info/alternates"):
            if lstat_output(os.path.join(self.agent_git_dir, name)) is not None:
                raise Failure(f"{self.agent_git_dir}/{name} borrows another repository")
        self.git_dir = os.path.join(private_dir(), "git")
        self._budget = [max_bytes, max_entries]
        os.mkdir(self.git_dir)
        for name in _GIT_COPIED:
            self._copy(name, directory=False)
        for name in _GIT_COPIED_DIRS:
            self._copy(name, directory=True)
        os.makedirs(os.path.join(self.git_dir, "refs", "heads"), exist_ok=True)
        with open(os.path.join(self.git_dir, "config"), "w") as f:
            f.write(_GIT_CONFIG)

    def git(self, *args: str, worktree: bool = False, check: bool = True, timeout_s: float = 15) -> str:
        """git's stdout; a non-zero exit is a Failure unless ``check`` is false (then stdout is "")."""
        result = run_trusted(self._argv(args), cwd=self.worktree if worktree else self.git_dir,
                             timeout_s=timeout_s, env=self._env(worktree=worktree))  # fmt: skip
        if result.timed_out:
            raise Failure(f"git {args[0]} did not finish within {timeout_s:g} s")
        if result.returncode != 0:
            if check:
                raise Failure(f"git {' '.join(args)} failed: {result.text(500)}")
            return ""
        return result.stdout.decode("utf-8", "replace")

    def _argv(self, args: tuple[str, ...]) -> list[str]:
        return ["git", "-c", "core.hooksPath=/dev/null", "-c", "core.fsmonitor=false",
                "-c", "core.useReplaceRefs=false", "-c", "core.untrackedCache=false", *args]  # fmt: skip

    def _env(self, *, worktree: bool) -> dict[str, str]:
        env = {
            "GIT_DIR": self.git_dir,
            "HOME": self.git_dir,
            "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_CONFIG_GLOBAL": "/dev/null",
            "GIT_ATTR_NOSYSTEM": "1",
            "GIT_NO_REPLACE_OBJECTS": "1",
            "GIT_TERMINAL_PROMPT": "0",
            "GIT_PAGER": "cat",
        }
        if worktree:
            env["GIT_WORK_TREE"] = self.worktree
        return env

    def succeeds(self, *args: str) -> bool:
        """Whether git exits with status 0 (for the commands that answer with it)."""
        argv = self._argv(args)
        result = run_trusted(argv, cwd=self.git_dir, timeout_s=15, env=self._env(worktree=False))
        return not result.timed_out and result.returncode == 0

    def rev(self, spec: str) -> str | None:
        """The object id ``spec`` names, or None."""
        return self.git("rev-parse", "-q", "--verify", "--end-of-options", spec, check=False).strip() or None

    def worktree_changes(self) -> str:
        """``git status`` lines for everything that differs from HEAD: staged, modified, untracked, ignored.

        Empty means clean. Staged changes come from the agent's index (compared by object id
        only); the working tree is compared with a fresh index read from HEAD.
        """
        if any(line.startswith("160000 ") for line in self.git("ls-files", "--stage").splitlines()):
            return "the index holds a submodule"
        staged = self.git("diff-index", "--cached", "--name-status", "--no-renames", "HEAD", "--")
        if staged.strip():
            return staged
        for relative, st in walk_output(self.worktree, max_entries=50_000).items():
            if stat.S_ISREG(st.st_mode) and st.st_size > _GIT_MAX_FILE_BYTES and not relative.startswith(".git/"):
                return f"{relative} is too large to compare"
        remove_output(os.path.join(self.git_dir, "index"))
        self.git("read-tree", "HEAD")
        return self.git("status", "--porcelain", "--untracked-files=all", "--ignored", "--ignore-submodules=all",
                        worktree=True)  # fmt: skip

    def _copy(self, relative: str, *, directory: bool) -> None:
        source = os.path.join(self.agent_git_dir, relative)
        st = lstat_output(source)
        if st is None:
            return
        target = os.path.join(self.git_dir, relative)
        if directory and stat.S_ISDIR(st.st_mode):
            os.makedirs(target, exist_ok=True)
            for entry, entry_st in sorted(walk_output(source, max_entries=self._budget[1]).items()):
                if relative == "objects" and entry.split("/")[0] == "info":
                    continue  # alternates and the like: other repositories' objects
                self._copy_entry(os.path.join(source, entry), os.path.join(target, entry), entry_st)
        else:
            self._copy_entry(source, target, st)

    def _copy_entry(self, source: str, target: str, st: os.stat_result) -> None:
        if stat.S_ISDIR(st.st_mode):
            os.makedirs(target, exist_ok=True)
            return
        if not stat.S_ISREG(st.st_mode):
            raise Failure(f"{source} is not a regular file or directory")
        self._budget[0] -= st.st_size
        self._budget[1] -= 1
        if self._budget[0] < 0 or self._budget[1] < 0:
            raise Failure(f"{self.agent_git_dir} is too large to inspect")
        data = read_output(source, max_bytes=st.st_size)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(target, "wb") as f:
            f.write(data)


# -- services: a server the agent started ---------------------------------------------------------
#
# The service is the agent's process: it may answer anything, slowly, endlessly, or not at all, and
# a process may call itself anything. So requests have timeouts and size caps and follow no
# redirects, the main() budget bounds the whole conversation, and the process behind the port is
# identified from the kernel's socket table, not from what it says.

_REACHABLE_FROM_LOOPBACK = {
    "0100007F",  # 127.0.0.1
    "00000000",  # 0.0.0.0
    "00000000000000000000000000000000",  # ::, dual-stack
    "0000000000000000FFFF00000100007F",  # ::ffff:127.0.0.1
}
_PYTHON_OPTIONS_WITH_VALUE = {"-W", "-X", "--check-hash-based-pycs"}


def http_request(
    port: int, method: str, path: str, body: bytes | None = None, *, timeout_s: float = 3, max_bytes: int = 1 << 20
) -> tuple[int, dict[str, str], bytes]:
    """(status, headers with lower-case names, body) of one request to 127.0.0.1:``port``."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout_s)
    try:
        conn.request(method, path, body=body, headers={"Connection": "close"})
        response = conn.getresponse()
        data = response.read(max_bytes + 1)
        if len(data) > max_bytes:
            raise Failure(f"{method} {path}: the answer is longer than {max_bytes} bytes")
        return response.status, {k.lower(): v for k, v in response.getheaders()}, data
    except (OSError, http.client.HTTPException, ValueError) as exc:
        raise Failure(f"{method} http://127.0.0.1:{port}{path} failed: {exc!r}") from None
    finally:
        conn.close()


def listening_pids(port: int) -> list[int]:
    """The processes holding a listening TCP socket that 127.0.0.1:``port`` reaches.

    Raises Failure when nothing listens there, or when a listening socket belongs to no process
    this checker can see (one that hides itself is not the service).
    """
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            address, _, port_hex = fields[1].rpartition(":")
            if fields[3] == "0A" and int(port_hex, 16) == port and address in _REACHABLE_FROM_LOOPBACK:
                inodes.add(fields[9])
    if not inodes:
        raise Failure(f"nothing listens on 127.0.0.1:{port}")
    holders: dict[str, list[int]] = {inode: [] for inode in inodes}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            fds = os.listdir(f"/proc/{name}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                link = os.readlink(f"/proc/{name}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:[") and link[8:-1] in holders:
                holders[link[8:-1]].append(int(name))
    if not all(holders.values()):
        raise Failure(f"a socket listening on port {port} belongs to no process the checker can see")
    return sorted({pid for pids in holders.values() for pid in pids})


def require_python_service(port: int, script: str, *, attempts: int = 10, pause_s: float = 0.2) -> None:
    """Wait for a listener on 127.0.0.1:``port`` (``attempts`` looks, ``pause_s`` apart), then require
    every process behind it to be ``python3 script`` (as far as runs_python_script() can tell)."""
    for attempt in range(attempts):
        try:
            pids = listening_pids(port)
            break
        except Failure:
            if attempt == attempts - 1:
                raise
            time.sleep(pause_s)
    strangers = [pid for pid in pids if not runs_python_script(pid, script)]
    if strangers:
        raise Failure(f"port {port} is held by processes that are not python3 {script}: {strangers}")


def runs_python_script(pid: int, script: str) -> bool:
    """Whether process ``pid`` is a Python interpreter started on ``script`` (a path or ``-m`` module).

    Read from /proc, which the process can partly rewrite (its own command line, its working
    directory): this tells the task's service from a stand-in that does not try to look like
    it, no more. The service's answers are checked as well.
    """
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = [a.decode("utf-8", "replace") for a in f.read(1 << 16).split(b"\0") if a]
        exe = os.readlink(f"/proc/{pid}/exe")
        cwd = os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        return False
    if not os.path.basename(exe).startswith("python") or len(argv) < 2:
        return False
    args = iter(argv[1:])
    for arg in args:
        if arg in _PYTHON_OPTIONS_WITH_VALUE:
            next(args, None)
        elif arg.startswith("-m"):
            module = arg[2:] or next(args, "")
            return os.path.join(cwd, module.replace(".", "/") + ".py") == script
        elif arg.startswith("-c") or arg == "-":
            return False
        elif not arg.startswith("-"):
            return os.path.normpath(os.path.join(cwd, arg)) == script
    return False
