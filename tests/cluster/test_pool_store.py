"""Ray host actors use the snapshot store the driver configured, on every node, including hosts started later.

A host actor's process has the environment of the Ray node it runs on, not the driver's, so a store
left to each host's defaults can silently differ from the one the driver meant. The test runs a real
multi-node Ray cluster on this machine (``ray.cluster_utils.Cluster``: a head and, later, a second
node, each a real raylet) from a driver subprocess, since this test session holds its own Ray
instance. The nodes are started with ``SNAPGYM_STORE`` pointing at a store nobody configured; then:

- a pool given ``store_dir`` keeps every host on it: the first host, the host of a node that joins
  later, and the host that replaces a killed one;
- a pool given no ``store_dir`` gets the driver's default (the driver's ``SNAPGYM_STORE``) in the
  backend factory every host runs;
- nothing is ever written to the nodes' own default store.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

DRIVER = r"""
import json, logging, os, sys, time
import ray
from ray.cluster_utils import Cluster

configured, driver_default, nodes_default = sys.argv[1:4]
os.environ["SNAPGYM_STORE"] = nodes_default  # what every node's processes inherit
cluster = Cluster(initialize_head=True, head_node_args={
    "num_cpus": 1, "resources": {"snapgym_host": 1}, "include_dashboard": False})
ray.init(address=cluster.address, logging_level=logging.ERROR, log_to_driver=False)
os.environ["SNAPGYM_STORE"] = driver_default  # the driver's own default, from here on

from pool import PoolConfig, SandboxPool, Template
from pool.backends import backend_factory

LIMITS = {"memory_limit_mb": 256, "pids_limit": 128, "disk_limit_mb": 64}


def template(name):
    return Template(name=f"store-{name}", setup=[f"echo {name} > a"], workdir="/w")


def hosts(pool):
    return [h for h in pool.stats()["hosts"] if h["alive"]]


def wait_for(pool, count, but_not=()):
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        alive = hosts(pool)
        if len(alive) == count and not {h["id"] for h in alive} & set(but_not):
            return alive
        time.sleep(0.2)
    raise SystemExit(f"hosts did not come: {pool.stats()['hosts']}")


def stores(pool):
    found = {}
    for host in hosts(pool):
        handle, _ = ray.get(pool._manager.host_info.remote(host["id"]))
        root = ray.get(handle.__ray_call__.remote(lambda actor: str(actor.backend.store.root)), timeout=60)
        found[host["id"]] = {"node": host["node_id"], "store": root}
    return found


report = {}
pool = SandboxPool(PoolConfig(min_warm=1, max_warm=2, max_size=8, backend_options={**LIMITS, "store_dir": configured}))
pool.add(template("first"))
report["first"] = stores(pool)
cluster.add_node(num_cpus=1, resources={"snapgym_host": 1})
report["joined"] = stores(pool) if wait_for(pool, 2) else None
victim = next(iter(report["joined"]))
handle, _ = ray.get(pool._manager.host_info.remote(victim))
ray.kill(handle, no_restart=True)
wait_for(pool, 2, but_not=[victim])
report["replaced"] = stores(pool)
report["later_snapshot"] = pool.add(template("later")).id
pool.close()

# Every host runs the pool's backend factory (above: on every node, and in later hosts too), so a store
# the driver resolves into the factory is the store every host uses.
report["default"] = backend_factory("local", LIMITS).keywords["store_dir"]
print("REPORT " + json.dumps(report), flush=True)
ray.shutdown()
cluster.shutdown()
"""


@pytest.mark.timeout(240)
def test_every_host_uses_the_store_the_driver_configured(tmp_path: Path) -> None:
    configured, driver_default, nodes_default = (tmp_path / name for name in ("configured", "driver", "nodes"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_ADDRESS")}
    done = subprocess.run(
        [sys.executable, "-c", DRIVER, str(configured), str(driver_default), str(nodes_default)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=220,
    )  # fmt: skip
    lines = [line for line in done.stdout.splitlines() if line.startswith("REPORT ")]
    assert done.returncode == 0 and lines, done.stderr[-4000:]
    report = json.loads(lines[0].removeprefix("REPORT "))

    assert {h["store"] for h in report["first"].values()} == {str(configured)}
    joined = report["joined"]
    assert len({h["node"] for h in joined.values()}) == 2  # the node that joined later hosts too
    assert {h["store"] for h in joined.values()} == {str(configured)}
    replaced = report["replaced"]
    assert set(replaced) - set(joined), "a new host replaced the killed one"
    assert {h["store"] for h in replaced.values()} == {str(configured)}
    assert (configured / "snapshots" / f"{report['later_snapshot']}.json").exists()

    assert report["default"] == str(driver_default)  # no store_dir: the driver's default, not the nodes'
    assert not nodes_default.exists(), "nothing may be written to a store nobody configured"
