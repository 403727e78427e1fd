"""verifykit_http: check a service the agent started, believing nothing a correct service would not say.

Identical copies live in the tests/ of the built-in service tasks, next to verifykit.py. The
service is the agent's process: it may answer anything, slowly, endlessly, or not at all, and a
process may call itself anything. So requests have timeouts and size caps and follow no
redirects, the main() budget bounds the whole conversation, and the process behind the port is
identified from the kernel's socket table, not from what it says.
"""

from __future__ import annotations

import http.client
import os

import verifykit as vk

_REACHABLE_FROM_LOOPBACK = {
    "0100007F",  # 127.0.0.1
    "00000000",  # 0.0.0.0
    "00000000000000000000000000000000",  # ::, dual-stack
    "0000000000000000FFFF00000100007F",  # ::ffff:127.0.0.1
}
_PYTHON_OPTIONS_WITH_VALUE = {"-W", "-X", "--check-hash-based-pycs"}


def request(
    port: int, method: str, path: str, body: bytes | None = None, *, timeout_s: float = 3, max_bytes: int = 1 << 20
) -> tuple[int, dict[str, str], bytes]:
    """(status, headers with lower-case names, body) of one request to 127.0.0.1:``port``."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout_s)
    try:
        conn.request(method, path, body=body, headers={"Connection": "close"})
        response = conn.getresponse()
        data = response.read(max_bytes + 1)
        if len(data) > max_bytes:
            raise vk.Failure(f"{method} {path}: the answer is longer than {max_bytes} bytes")
        return response.status, {k.lower(): v for k, v in response.getheaders()}, data
    except (OSError, http.client.HTTPException, ValueError) as exc:
        raise vk.Failure(f"{method} http://127.0.0.1:{port}{path} failed: {exc!r}") from None
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
        raise vk.Failure(f"nothing listens on 127.0.0.1:{port}")
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
        raise vk.Failure(f"a socket listening on port {port} belongs to no process the checker can see")
    return sorted({pid for pids in holders.values() for pid in pids})


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
