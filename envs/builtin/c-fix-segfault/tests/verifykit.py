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
"""

from __future__ import annotations

import contextlib
import ctypes
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
