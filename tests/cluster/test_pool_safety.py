"""From inside a pooled sandbox, nothing of Ray or of the pool's own plumbing can be reached or seen."""

from __future__ import annotations

import json
import os
import shlex
import socket
from pathlib import Path

import ray

from pool import Snapshot
from pool.cluster.sandbox_pool import SandboxPool
from tests.support.fixtures.pool_fixtures import host_pid

pytest_plugins = ["tests.support.fixtures.pool_fixtures"]

PROBE = """
import json, socket, sys
results = {}
server = socket.socket()
server.bind(("127.0.0.1", 0))
server.listen()
socket.create_connection(server.getsockname(), timeout=2).close()
results["control"] = "connected"
for host, port in json.loads(sys.argv[1]):
    try:
        socket.create_connection((host, port), timeout=2).close()
        results[f"{host}:{port}"] = "connected"
    except OSError as exc:
        results[f"{host}:{port}"] = type(exc).__name__
for path in json.loads(sys.argv[2]):
    unix = socket.socket(socket.AF_UNIX)
    try:
        unix.connect(path)
        results[path] = "connected"
    except OSError as exc:
        results[path] = type(exc).__name__
print(json.dumps(results))
"""


def _ray_ports() -> dict[str, int]:
    gcs_port = int(ray.get_runtime_context().gcs_address.rsplit(":", 1)[1])
    node = next(n for n in ray.nodes() if n["Alive"])
    names = ("NodeManagerPort", "ObjectManagerPort", "MetricsExportPort", "MetricsAgentPort", "RuntimeEnvAgentPort",
             "DashboardAgentListenPort")  # fmt: skip
    ports = {name: int(node[name]) for name in names if isinstance(node.get(name), int) and node[name] > 0}
    return {"GCS": gcs_port, **ports}


def _reachable_here(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=2).close()
    except OSError:
        return False
    return True


def test_ray_ports_are_unreachable_from_a_pooled_sandbox(shared_pool: SandboxPool, base_snapshot: Snapshot) -> None:
    """Ray's ports (GCS, raylet, agents) and Unix sockets, open on the host, are unreachable from a sandbox."""
    gcs_host = ray.get_runtime_context().gcs_address.rsplit(":", 1)[0]
    node_ip = ray.util.get_node_ip_address()
    ports = _ray_ports()
    assert _reachable_here(gcs_host, ports["GCS"]), "the GCS must answer on the host for this test to mean anything"
    assert _reachable_here(node_ip, ports["NodeManagerPort"])
    targets = sorted({(ip, port) for port in ports.values() for ip in (gcs_host, node_ip, "127.0.0.1")})
    node = next(n for n in ray.nodes() if n["Alive"])
    with shared_pool.acquire(base_snapshot) as lease:
        host_fastpath = ray.get(lease._host.ping.remote(), timeout=30)["fastpath"]
        unix_paths = [node["RayletSocketName"], node["ObjectStoreSocketName"], shared_pool._fastpath_path,
                      host_fastpath]  # fmt: skip
        assert all(os.path.exists(path) for path in unix_paths)  # they exist on the host
        lease.write_file("/tmp/probe.py", PROBE)
        command = f"python3 /tmp/probe.py {shlex.quote(json.dumps(targets))} {shlex.quote(json.dumps(unix_paths))}"
        result = lease.exec(command, timeout_s=60)
    assert result.exit_code == 0, result.stderr
    outcome = json.loads(result.stdout)
    assert outcome.pop("control") == "connected"  # the probe itself works
    assert len(outcome) == len(targets) + len(unix_paths)
    connected = [target for target, status in outcome.items() if status == "connected"]
    assert not connected, f"reachable from inside the sandbox: {connected}"


def test_ray_files_environment_and_processes_are_invisible_inside(
    shared_pool: SandboxPool, base_snapshot: Snapshot
) -> None:
    """Ray's session directory, /tmp/ray, /dev/shm, RAY_ variables and processes are invisible in a sandbox."""
    session_dir = ray._private.worker._global_node.get_session_dir_path()
    assert os.path.isdir(session_dir)
    host_shm = set(os.listdir("/dev/shm"))
    with shared_pool.acquire(base_snapshot) as lease:
        host_env = Path(f"/proc/{host_pid(lease)}/environ").read_bytes()
        assert b"RAY_" in host_env  # the host actor itself runs with Ray's variables
        paths = [session_dir, "/tmp/ray", os.path.dirname(shared_pool._fastpath_path)]
        checks = lease.exec(" ; ".join(f"test -e {shlex.quote(p)} && echo present:{p}" for p in paths) + " ; true")
        env = lease.exec("env; cat /proc/1/environ | tr '\\0' '\\n'")
        processes = lease.exec("ps -eo args")
        shm = lease.exec("ls -A /dev/shm 2>/dev/null || true")
    assert checks.stdout == ""
    assert env.ok and "PATH=" in env.stdout
    names = {line.split("=", 1)[0] for line in env.stdout.splitlines() if "=" in line}
    assert not [name for name in names if name.upper().startswith("RAY")], names
    assert processes.ok and "ray::" not in processes.stdout and "raylet" not in processes.stdout
    assert "gcs_server" not in processes.stdout
    assert not host_shm & set(shm.stdout.split())
