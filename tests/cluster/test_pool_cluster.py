"""The pool on a real two-node Ray cluster: ``ray start`` twice on this machine, the benchmark as a Ray job.

The head and a second node each offer ``SLOTS_PER_NODE`` sandboxes (``snapgym_host``/``snapgym_slots``). The
job's pool keeps more warm sandboxes than one node may hold, so it has to place them on both; the test reads
where they were from the job's ``summary.json`` and checks those are the cluster's two nodes.

Both nodes are private to the test: their own temporary directories, ports from a block nobody else was
using, and ``ray start --block`` in a session of its own, so teardown stops exactly these processes (and
what they started) without ``ray stop``, which would stop every Ray instance on the machine.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
SLOTS_PER_NODE = 4
MIN_WARM = 6
"""More warm sandboxes than one node may hold: the pool must use both."""
UPLOAD_EXCLUDES = [".git", "outputs", "multirun", "results", ".mypy_cache", ".ruff_cache", ".pytest_cache",
                   "**/__pycache__", "*.egg-info", "notebooks"]  # fmt: skip
BENCH_BUDGET = [
    "benchmark.warmup=1",
    "benchmark.repetitions.acquire=5",
    "benchmark.repetitions.reset=5",
    "benchmark.repetitions.exec=5",
    f"benchmark.min_warm={MIN_WARM}",
    f"benchmark.capacity.sandboxes={2 * SLOTS_PER_NODE}",
    "benchmark.capacity.timeout_s=120",
]
PORTS_PER_NODE = 6
WORKER_PORTS = 40


def _ray_cli() -> list[str]:
    """The ``ray`` command of this interpreter's installation."""
    beside = Path(sys.executable).parent / "ray"
    return [str(beside)] if beside.exists() else [sys.executable, "-m", "ray.scripts.scripts"]


def _env(token: str) -> dict[str, str]:
    """This process's environment, with nothing that points Ray at another cluster, and the cluster's own token.

    Ray (2.60 here) turns token authentication on for ``ray start --head`` when ``~/.ray/auth_token`` exists, but
    not for ``ray start --address`` or the job client, so the second node could not join; setting it for every
    process explicitly, with a token of the test's own, makes the cluster the same on every machine.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token)
    return env


# -- processes ------------------------------------------------------------------


def _proc_stat(pid: int) -> list[str] | None:
    """Fields of /proc/<pid>/stat after the command name (state first), or None when it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None


def _alive(pid: int) -> bool:
    fields = _proc_stat(pid)
    return fields is not None and fields[0] not in ("Z", "X")


def _all_pids() -> list[int]:
    return [int(entry) for entry in os.listdir("/proc") if entry.isdigit()]


def _descendants(roots: set[int]) -> set[int]:
    """Every live process below ``roots`` in the process tree."""
    parents = {}
    for pid in _all_pids():
        fields = _proc_stat(pid)
        if fields is not None:
            parents[pid] = int(fields[1])
    found: set[int] = set()
    todo = list(roots)
    while todo:
        parent = todo.pop()
        children = [pid for pid, ppid in parents.items() if ppid == parent and pid not in found]
        found.update(children)
        todo.extend(children)
    return found


def _mentioning(text: str) -> set[int]:
    """Live processes whose command line contains ``text``."""
    found = set()
    for pid in _all_pids():
        if pid == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline and _alive(pid):
            found.add(pid)
    return found


def _signal_all(pids: set[int], sig: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def _wait_gone(pids: set[int], timeout_s: float) -> set[int]:
    deadline = time.monotonic() + timeout_s
    while True:
        alive = {pid for pid in pids if _alive(pid)}
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.2)


# -- ports ----------------------------------------------------------------------


def _port_block(count: int) -> list[int]:
    """``count`` consecutive ports that are free now, below the ephemeral range (the OS hands none of them out)."""
    for _ in range(200):
        base = random.randrange(20000, 32000 - count)
        if all(_free(port) for port in range(base, base + count)):
            return list(range(base, base + count))
    raise RuntimeError(f"found no {count} consecutive free ports between 20000 and 32000")


def _free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind(("", port))
        except OSError:
            return False
    return True


# -- the cluster ----------------------------------------------------------------


@dataclass
class Cluster:
    """Two Ray nodes started by this test."""

    root: Path
    gcs_address: str
    dashboard_url: str
    token: str
    starters: list[subprocess.Popen[bytes]]

    def headers(self) -> dict[str, str]:
        """What an HTTP request to the dashboard carries to be let in."""
        return {"Authorization": f"Bearer {self.token}"}


def _node_args(ports: list[int], temp_dir: Path) -> list[str]:
    """Options every node gets: its own ports and directory, one CPU, and sandbox slots."""
    resources = json.dumps({"snapgym_host": 1, "snapgym_slots": SLOTS_PER_NODE})
    return [
        f"--node-manager-port={ports[0]}",
        f"--object-manager-port={ports[1]}",
        f"--metrics-export-port={ports[2]}",
        f"--dashboard-agent-listen-port={ports[3]}",
        f"--dashboard-agent-grpc-port={ports[4]}",
        f"--runtime-env-agent-port={ports[5]}",
        f"--min-worker-port={ports[PORTS_PER_NODE]}",
        f"--max-worker-port={ports[PORTS_PER_NODE + WORKER_PORTS - 1]}",
        "--num-cpus=1",
        "--num-gpus=0",
        f"--resources={resources}",
        f"--object-store-memory={100 * 2**20}",
        f"--temp-dir={temp_dir}",
        "--disable-usage-stats",
        "--block",
    ]


def _start(args: list[str], log: Path, token: str) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            [*_ray_cli(), "start", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=_env(token),
            start_new_session=True,
        )


def _wait_for(what: str, probe: Any, starters: list[subprocess.Popen[bytes]], logs: list[Path],
              timeout_s: float = 120.0) -> Any:  # fmt: skip
    """Poll ``probe`` until it returns something truthy; fail early if a ``ray start`` exited."""
    deadline = time.monotonic() + timeout_s
    last: object = None
    while True:
        try:
            last = probe()
            if last:
                return last
        except Exception as exc:  # not up yet
            last = exc
        exited = [p for p in starters if p.poll() is not None]
        if exited or time.monotonic() > deadline:
            tails = "\n".join(f"--- {log}:\n{log.read_text(errors='replace')[-3000:]}" for log in logs)
            reason = f"`ray start` exited with {exited[0].returncode}" if exited else f"{timeout_s:.0f} s passed"
            pytest.fail(f"waiting for {what}: {reason} (last: {last!r})\n{tails}")
        time.sleep(0.5)


def _alive_nodes(cluster: Cluster) -> list[dict[str, Any]]:
    """The cluster's live nodes, from the dashboard's state API."""
    url = f"{cluster.dashboard_url}/api/v0/nodes?limit=100&detail=1"
    request = urllib.request.Request(url, headers=cluster.headers())
    with urllib.request.urlopen(request, timeout=10) as response:
        reply = json.loads(response.read())
    nodes: list[dict[str, Any]] = reply["data"]["result"]["result"]
    return [n for n in nodes if n["state"] == "ALIVE"]


def _stop(cluster: Cluster) -> set[int]:
    """Stop this test's nodes and everything they started, and nothing else; returns what survived."""
    starter_pids = {p.pid for p in cluster.starters}
    tree = _descendants(starter_pids) | _mentioning(f"{cluster.root}/")
    tree |= _descendants(tree)
    # `ray start --block` stops its node's processes on SIGTERM (raylet first, the GCS last).
    _signal_all(starter_pids, signal.SIGTERM)
    for starter in cluster.starters:
        with contextlib.suppress(subprocess.TimeoutExpired):
            starter.wait(timeout=30)
    leftover = _wait_gone(tree, 10)
    leftover |= _mentioning(f"{cluster.root}/")
    leftover |= _descendants(leftover)
    _signal_all(leftover | starter_pids, signal.SIGKILL)
    for starter in cluster.starters:
        with contextlib.suppress(subprocess.TimeoutExpired):
            starter.wait(timeout=10)
    return _wait_gone(tree | leftover, 10) | _mentioning(f"{cluster.root}/")


@pytest.fixture()
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    """A head (with the dashboard, for jobs) and a second node, both on this machine, stopped afterwards."""
    # Unix sockets live under the temp dir, and their paths may not exceed ~107 characters: keep it short.
    root = Path(tempfile.mkdtemp(prefix="rc", dir="/tmp"))
    ports = _port_block(3 + 2 * (PORTS_PER_NODE + WORKER_PORTS))
    gcs_port, dashboard_port, client_port = ports[:3]
    head_ports = ports[3 : 3 + PORTS_PER_NODE + WORKER_PORTS]
    worker_ports = ports[3 + PORTS_PER_NODE + WORKER_PORTS :]
    gcs_address = f"127.0.0.1:{gcs_port}"
    dashboard_url = f"http://127.0.0.1:{dashboard_port}"
    logs = [tmp_path / "head.log", tmp_path / "worker.log"]
    made = Cluster(root, gcs_address, dashboard_url, secrets.token_hex(32), [])
    try:
        head_args = [
            "--head",
            f"--port={gcs_port}",
            "--include-dashboard=true",
            "--dashboard-host=127.0.0.1",
            f"--dashboard-port={dashboard_port}",
            f"--ray-client-server-port={client_port}",
            *_node_args(head_ports, root / "h"),
        ]
        made.starters.append(_start(head_args, logs[0], made.token))
        _wait_for("the head's dashboard", lambda: _alive_nodes(made), made.starters, logs[:1])
        worker_args = [f"--address={gcs_address}", *_node_args(worker_ports, root / "w")]
        made.starters.append(_start(worker_args, logs[1], made.token))
        _wait_for("two live nodes", lambda: len(_alive_nodes(made)) == 2, made.starters, logs)
        yield made
    finally:
        left = _stop(made)
        shutil.rmtree(root, ignore_errors=True)
        assert not left, f"processes of the test's Ray nodes outlived it: {sorted(left)}"


# -- the test -------------------------------------------------------------------


@pytest.mark.timeout(600)
def test_pool_benchmark_job_uses_both_nodes(cluster: Cluster, tmp_path: Path) -> None:
    """A benchmark submitted with ``ray job submit`` joins the cluster and holds sandboxes on both nodes."""
    from ray.job_submission import JobStatus, JobSubmissionClient

    out = tmp_path / "run"
    job_id = f"snapgym-cluster-{uuid.uuid4().hex[:8]}"
    entrypoint = [sys.executable, "-m", "benchmarks.run", "benchmark=pool", *BENCH_BUDGET,
                  f"backend.store_dir={tmp_path / 'store'}", f"hydra.run.dir={out}"]  # fmt: skip
    started = time.monotonic()
    done = subprocess.run(
        [*_ray_cli(), "job", "submit", f"--address={cluster.dashboard_url}", f"--submission-id={job_id}",
         f"--working-dir={REPO}", f"--runtime-env-json={json.dumps({'excludes': UPLOAD_EXCLUDES})}",
         "--", *entrypoint],
        capture_output=True,
        text=True,
        timeout=420,
        env=_env(cluster.token),
    )  # fmt: skip
    took = time.monotonic() - started
    status = JobSubmissionClient(cluster.dashboard_url, headers=cluster.headers()).get_job_status(job_id)
    assert done.returncode == 0 and status == JobStatus.SUCCEEDED, (
        f"job {job_id}: {status} after {took:.0f} s, `ray job submit` exited {done.returncode}\n"
        f"{done.stdout[-4000:]}\n{done.stderr[-2000:]}"
    )

    summary = json.loads((out / "summary.json").read_text())
    nodes = {n["node_id"]: n for n in _alive_nodes(cluster)}
    assert len(nodes) == 2
    assert sum(n["is_head_node"] for n in nodes.values()) == 1
    assert all(n["resources_total"].get("snapgym_slots") == SLOTS_PER_NODE for n in nodes.values()), nodes

    # The latency pool: one host actor per node, each holding sandboxes when the latency part ended.
    hosts = summary["meta"]["pool_stats"]["hosts"]
    assert len(hosts) == 2, hosts
    assert {h["node_id"] for h in hosts} == set(nodes), (hosts, sorted(nodes))
    for host in hosts:
        assert host["alive"], host
        assert host["capacity"] == SLOTS_PER_NODE, host
        assert 1 <= host["slots"] <= SLOTS_PER_NODE, host
    assert sum(h["slots"] for h in hosts) >= MIN_WARM
    stats = summary["meta"]["pool_stats"]
    assert stats["host_failures"] == 0 and stats["host_restarts"] == 0, stats
    assert stats["acquires"] >= 10

    # The capacity pool warmed every slot of the cluster, more than either node may hold.
    assert summary["meta"]["capacity"]["ready"] == 2 * SLOTS_PER_NODE
    assert summary["meta"]["capacity"]["machines"] == 1, "two nodes on one machine count its memory once"
    assert set(summary["methods"]) == {"acquire", "reset", "exec_lease", "exec_direct"}
    assert all(entry["n"] == 5 for entry in summary["methods"].values())


# -- a node dies mid-run ----------------------------------------------------------------------------------

KILL_EPISODES = 48
KILL_AFTER_RESULTS = 10
KILL_PLAN = [
    "pool=ray",
    "pool.size=6",  # more episodes at once than one node holds sandboxes: both nodes serve the run
    "pool.min_warm=2",
    "pool.max_warm=8",
    f"pool.max_size={2 * SLOTS_PER_NODE}",
    "suite=dir",
    "suite.path=benchmarks/tasks/trivial",
    f"episodes_per_task={KILL_EPISODES}",
    "agent=replay",
    "agent.actions=['sleep 0.4','echo ok > /app/answer.txt']",
    "max_attempts=5",
    "pool.acquire_timeout_s=30",  # a starved acquire fails its attempt instead of stalling the test
    "progress=false",
]


def _ledger(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]


def _kill_worker_node(cluster: Cluster) -> set[int]:
    """SIGKILL every process of the second node at once (its raylet, workers, host actor, sandbox daemon)."""
    starter = cluster.starters[1]
    victims = {starter.pid} | _descendants({starter.pid}) | _mentioning(f"{cluster.root}/w/")
    victims |= _descendants(victims)
    _signal_all(victims, signal.SIGKILL)
    return victims


@pytest.mark.timeout(600)
def test_killing_a_node_mid_run_loses_no_episode(cluster: Cluster, tmp_path: Path) -> None:
    """An eval job on the Ray pool survives the death of one node: every episode ends exactly once.

    Episodes whose sandbox was on the killed node fail as infrastructure errors, are retried under new attempt
    ids on the surviving node, and score; none is recorded twice and none is averaged in as a 0.
    """
    from ray.job_submission import JobStatus, JobSubmissionClient

    out = tmp_path / "run"
    job_id = f"snapgym-kill-{uuid.uuid4().hex[:8]}"
    entrypoint = [sys.executable, "-m", "benchmarks.run", *KILL_PLAN, f"backend.store_dir={tmp_path / 'store'}",
                  f"output_dir={out}", f"hydra.run.dir={tmp_path / 'hydra'}"]  # fmt: skip
    client = JobSubmissionClient(cluster.dashboard_url, headers=cluster.headers())
    submitted = subprocess.run(
        [*_ray_cli(), "job", "submit", "--no-wait", f"--address={cluster.dashboard_url}", f"--submission-id={job_id}",
         f"--working-dir={REPO}", f"--runtime-env-json={json.dumps({'excludes': UPLOAD_EXCLUDES})}",
         "--", *entrypoint],
        capture_output=True, text=True, timeout=120, env=_env(cluster.token),
    )  # fmt: skip
    assert submitted.returncode == 0, submitted.stderr[-3000:]

    ledger = out / "ledger.jsonl"
    deadline = time.monotonic() + 300
    while sum(r["kind"] == "result" for r in _ledger(ledger)) < KILL_AFTER_RESULTS:
        status = client.get_job_status(job_id)
        assert status in (JobStatus.PENDING, JobStatus.RUNNING), (status, client.get_job_logs(job_id)[-4000:])
        assert time.monotonic() < deadline, "the job recorded too few results in time"
        time.sleep(0.2)
    before = _ledger(ledger)
    assert sum(r["kind"] == "result" for r in before) < KILL_EPISODES, "the run ended before the kill"
    _kill_worker_node(cluster)

    killed_at = time.monotonic()
    while (status := client.get_job_status(job_id)) in (JobStatus.PENDING, JobStatus.RUNNING):
        if time.monotonic() - killed_at > 150:
            counts = {k: sum(r["kind"] == k for r in _ledger(ledger)) for k in ("attempt", "attempt_failed", "result")}
            pytest.fail(f"the job did not finish after the node died; ledger {counts}\n"
                        f"{client.get_job_logs(job_id)[-6000:]}")  # fmt: skip
        time.sleep(0.5)
    logs = client.get_job_logs(job_id)
    assert status == JobStatus.SUCCEEDED, logs[-5000:]

    records = _ledger(ledger)
    results = [r for r in records if r["kind"] == "result"]
    ids = [r["episode_id"] for r in results]
    assert len(ids) == len(set(ids)) == KILL_EPISODES, "every episode must end exactly once"
    assert {r["outcome"] for r in results} == {"scored"}, [r for r in results if r["outcome"] != "scored"][:3]
    assert all(r["reward"] == 1.0 for r in results)

    failed = [r for r in records if r["kind"] == "attempt_failed" and not r["interrupted"]]
    assert failed, "killing a node that held leased sandboxes must fail some attempts"
    retried = {r["episode_id"] for r in failed}
    for result in results:
        if result["episode_id"] in retried:
            assert result["attempt"] >= 2 and result["infra_failures"] >= 1, result
    attempt_ids = [r["attempt_id"] for r in records if r["kind"] == "attempt"]
    assert len(attempt_ids) == len(set(attempt_ids)), "attempt ids are unique"

    summary = json.loads((out / "summary.json").read_text())
    assert summary["counts"]["finished"] == summary["counts"]["scheduled"] == KILL_EPISODES
    assert summary["counts"]["retried_attempts"] == len(failed)
    assert summary["mean_reward"] == 1.0
    hosts = summary["pool_stats"]["hosts"]
    assert sum(not h["alive"] for h in hosts) >= 1 or summary["pool_stats"]["host_failures"] >= 1, hosts


# -- a node joins mid-run ------------------------------------------------------------------------------------

JOIN_DRIVER = """
import json, sys, time
from pool import PoolConfig, SandboxPool, Template
pool = SandboxPool(PoolConfig(min_warm=2, max_warm=12, max_size=12))
snapshot = pool.add(Template(name="join", setup=["mkdir -p /w && echo hi > /w/a"], workdir="/w"))
print(json.dumps({"hosts_before": len([h for h in pool.stats()["hosts"] if h["alive"]])}), flush=True)
sys.stdin.readline()  # the test starts a third node, then says so
deadline = time.monotonic() + 90
while len([h for h in pool.stats()["hosts"] if h["alive"]]) < 3 and time.monotonic() < deadline:
    time.sleep(0.5)
ready = pool.warm_up(snapshot, WANTED, timeout_s=60)  # more than the first two nodes may hold
leases = [pool.acquire(snapshot) for _ in range(WANTED)]
outputs = {lease.exec("cat a").stdout for lease in leases}
stats = pool.stats()
for lease in leases:
    lease.release()
pool.close()
print(json.dumps({"ready": ready, "outputs": sorted(outputs), "stats": stats}), flush=True)
"""


@pytest.mark.timeout(600)
def test_a_node_that_joins_later_hosts_sandboxes(cluster: Cluster, tmp_path: Path) -> None:
    """A running pool notices a hosting node that joined the cluster, builds its snapshots there, and uses it."""
    wanted = 2 * SLOTS_PER_NODE + 2
    env = {**_env(cluster.token), "RAY_ADDRESS": cluster.gcs_address, "SNAPGYM_STORE": str(tmp_path / "store"),
           "PYTHONPATH": str(REPO)}  # fmt: skip
    driver = subprocess.Popen(
        [sys.executable, "-c", JOIN_DRIVER.replace("WANTED", str(wanted))],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=(tmp_path / "driver.log").open("wb"),
        text=True, env=env, cwd=tmp_path,
    )  # fmt: skip
    try:
        assert driver.stdout is not None and driver.stdin is not None
        first = driver.stdout.readline()
        assert first, (tmp_path / "driver.log").read_text()[-4000:]
        assert json.loads(first)["hosts_before"] == 2

        ports = _port_block(PORTS_PER_NODE + WORKER_PORTS)
        log = tmp_path / "third.log"
        cluster.starters.append(_start([f"--address={cluster.gcs_address}", *_node_args(ports, cluster.root / "x")],
                                       log, cluster.token))  # fmt: skip
        _wait_for("three live nodes", lambda: len(_alive_nodes(cluster)) == 3, cluster.starters, [log])
        driver.stdin.write("joined\n")
        driver.stdin.flush()
        last = driver.stdout.readline()
        assert driver.wait(timeout=180) == 0, (tmp_path / "driver.log").read_text()[-4000:]
    finally:
        if driver.poll() is None:
            driver.kill()
    outcome = json.loads(last)
    stats = outcome["stats"]
    alive = [h for h in stats["hosts"] if h["alive"]]
    assert {h["node_id"] for h in alive} == {n["node_id"] for n in _alive_nodes(cluster)}
    assert len(alive) == 3 and stats["hosts_joined"] == 1, stats["hosts"]
    assert all(h["slots"] >= 1 for h in alive), "every node, the new one included, holds sandboxes"
    assert outcome["ready"] >= wanted and outcome["outputs"] == ["hi\n"]
