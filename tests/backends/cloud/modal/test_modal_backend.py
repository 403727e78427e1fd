"""The Modal backend, through the real ``modal`` SDK, against the stand-in Modal service
(tests/backends/cloud/modal/standin.py: the gRPC control plane and command router), whose sandboxes are local ones:
the conformance suite, builds remembered by name, GPU sandboxes for tasks that ask for GPUs, lifetimes,
labels as tags, retries of RESOURCE_EXHAUSTED, the runner and reaping."""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pool import ConfigError, Resources, Template
from pool.backends import load_backend, unavailable_reason
from pool.backends.modal import ModalBackend
from pool.egress import NetworkPolicy, Phase
from pool.errors import SandboxCrashedError, SandboxEndedError, UnsupportedError
from pool.labels import OWNER
from pool.testing import check_backend
from tests.backends.cloud.modal.standin import ModalStandin

pytest_plugins = ["tests.backends.cloud.modal.standin"]

TEMPLATE = Template(name="modal-test", setup=["mkdir -p /w && echo ready > /w/state"], workdir="/w")


def options(standin: ModalStandin, tmp_path: Path, **more: object) -> dict[str, object]:
    return {"token_id": standin.token_id, "token_secret": standin.token_secret, "server_url": standin.url,
            "base_image": standin.base_image_id, "registry_file": str(tmp_path / "images.json"), **more}  # fmt: skip


@pytest.fixture
def modal_backend(modal_standin: ModalStandin, tmp_path: Path) -> Iterator[ModalBackend]:
    with ModalBackend(**options(modal_standin, tmp_path)) as backend:  # type: ignore[arg-type]
        yield backend


def running(standin: ModalStandin) -> list[str]:
    return [sid for sid, record in standin.sandboxes().items() if record.state == "running"]


def settle(standin: ModalStandin, within_s: float = 15) -> list[str]:
    deadline = time.monotonic() + within_s
    while (left := running(standin)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def test_the_conformance_suite_passes(modal_backend: ModalBackend) -> None:
    check_backend(modal_backend)


def test_a_second_build_is_remembered_and_sandboxes_carry_tags_and_a_lifetime(
    modal_standin: ModalStandin, modal_backend: ModalBackend, tmp_path: Path
) -> None:
    snapshot = modal_backend.build(TEMPLATE)
    created = modal_standin.created_count
    with ModalBackend(**options(modal_standin, tmp_path)) as other:  # type: ignore[arg-type]
        assert other.build(TEMPLATE).layers == snapshot.layers
    assert modal_standin.created_count == created
    with modal_backend.create(snapshot, labels={"snapgym.run": "r1"}) as sandbox:
        assert sandbox.exec("cat state").stdout == "ready\n"
        record = modal_standin.sandboxes()[str(sandbox.remote_id)]
        assert record.tags["snapgym.run"] == "r1" and record.tags[OWNER] == modal_backend.owner
        assert record.timeout_s == 3600 and record.network == "blocked" and record.gpu is None
    assert settle(modal_standin) == []


KILL_ENTRYPOINT = (
    'for p in /proc/[0-9]*; do [ "$(cat $p/comm 2>/dev/null)" = sleep ] && kill -9 "${p#/proc/}"; done; sleep 5'
)
"""The agent's side: SIGKILL the sandbox's entrypoint (``sleep infinity``), which ends the sandbox."""


def test_a_sandbox_its_own_processes_ended_is_the_agents_doing_one_modal_ended_is_not(
    modal_standin: ModalStandin, modal_backend: ModalBackend
) -> None:
    """An agent that kills the entrypoint must not pass for a provider failure (an unscored episode would
    hide its failure): the step raises SandboxEndedError. A sandbox Modal terminated or timed out stays a
    crash, never the agent's doing."""
    snapshot = modal_backend.build(TEMPLATE)
    with (
        modal_backend.create(snapshot) as sandbox,
        pytest.raises(SandboxEndedError, match="its entrypoint exited with code 137"),
    ):
        sandbox.exec(KILL_ENTRYPOINT, timeout_s=20)
    for ended_by in ("terminate", "timeout"):
        with modal_backend.create(snapshot) as sandbox:
            box = modal_standin.box(str(sandbox.remote_id))
            assert box is not None and modal_standin.end_box(box, ended_by)
            with pytest.raises(SandboxCrashedError) as caught:
                sandbox.exec("true")
            assert not isinstance(caught.value, SandboxEndedError), ended_by


def test_a_task_that_asks_for_gpus_gets_a_modal_gpu_sandbox(modal_standin: ModalStandin, tmp_path: Path) -> None:
    template = Template(
        name="modal-gpu", setup=["mkdir -p /w"], workdir="/w", resources=Resources(gpus=2, gpu_types=("H100",))
    )
    with ModalBackend(**options(modal_standin, tmp_path)) as backend:  # type: ignore[arg-type]
        assert backend.capabilities.gpu and "H100" in backend.capabilities.gpu_types
        with backend.create(backend.build(template)) as sandbox:
            record = modal_standin.sandboxes()[str(sandbox.remote_id)]
            assert record.gpu == "H100:2" and record.api == "v1"
        with pytest.raises(ConfigError, match="GPU of type"):
            backend.build(Template(name="modal-tpu", resources=Resources(gpus=1, gpu_types=("TPU-v5",))))


def test_resource_exhausted_creates_are_retried(modal_standin: ModalStandin, modal_backend: ModalBackend) -> None:
    snapshot = modal_backend.build(TEMPLATE)
    modal_backend.prewarm = False
    modal_standin.fail_next("SandboxCreateV2", "RESOURCE_EXHAUSTED", count=2)
    with modal_backend.create(snapshot) as sandbox:
        assert sandbox.exec("cat state").stdout == "ready\n"


def test_network_policies_replace_the_modal_outbound_policy(
    modal_standin: ModalStandin, modal_backend: ModalBackend
) -> None:
    """A sandbox starts blocked; each phase's policy replaces Modal's outbound allowlist at run time."""
    with modal_backend.create(modal_backend.build(TEMPLATE)) as sandbox:
        record = modal_standin.sandboxes()[str(sandbox.remote_id)]
        sandbox.set_network(NetworkPolicy.offline(), phase=Phase.AGENT)  # as created: nothing to change
        assert record.network == "blocked" and modal_standin.sandboxes()[record.sandbox_id].network_changes == ()
        sandbox.set_network(NetworkPolicy.allowlist(["pypi.org", "*.astral.sh", "203.0.113.0/24"]), phase=Phase.AGENT)
        allowlisted = modal_standin.sandboxes()[record.sandbox_id]
        sandbox.set_network(NetworkPolicy.public(), phase=Phase.VERIFIER)
        public = modal_standin.sandboxes()[record.sandbox_id]
        sandbox.set_network(NetworkPolicy.offline(), phase=Phase.VERIFIER)
        offline = modal_standin.sandboxes()[record.sandbox_id]
        with pytest.raises(UnsupportedError, match="not port"):
            sandbox.set_network(NetworkPolicy.allowlist(["pypi.org:443"]), phase=Phase.AGENT)
    assert allowlisted.network == "allowlist"
    assert allowlisted.outbound_cidrs == ("203.0.113.0/24",)
    assert allowlisted.outbound_domains == ("pypi.org", "*.astral.sh")
    # public: every global IPv4 range, not the metadata address, loopback or private ranges
    cidrs = [ipaddress.ip_network(cidr) for cidr in public.outbound_cidrs]
    for address in ("8.8.8.8", "1.1.1.1", "203.0.113.7"):
        assert any(ipaddress.ip_address(address) in cidr for cidr in cidrs), address
    for address in ("169.254.169.254", "127.0.0.1", "10.1.2.3", "192.168.0.1", "172.16.5.5", "100.64.0.1"):
        assert not any(ipaddress.ip_address(address) in cidr for cidr in cidrs), address
    assert public.outbound_domains == ()
    assert offline.network == "allowlist" and offline.outbound_cidrs == () and offline.outbound_domains == ()
    assert len(offline.network_changes) == 3
    assert modal_backend.capabilities.network_modes == ("no-network", "public", "allowlist")


@pytest.mark.parametrize(("agent", "reward"), [("oracle", 1.0), ("noop", 0.0)])
def test_the_runner_scores_builtin_tasks_on_modal(
    modal_standin: ModalStandin, tmp_path: Path, agent: str, reward: float
) -> None:
    run_dir = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.run", "backend=modal", f"backend.base_image={modal_standin.base_image_id}",
         f"backend.registry_file={tmp_path / 'images.json'}", f"agent={agent}",
         "suite.include=[csv-sales-summary,git-*]", "suite.limit=2", "progress=false", "benchmark.plots=false",
         f"output_dir={run_dir}", f"hydra.run.dir={tmp_path / 'hydra'}"],
        cwd=Path(__file__).parents[4], env={**os.environ, **modal_standin.sdk_env},
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["mean_reward"] == reward and summary["counts"].get("scored") == 2, summary
    assert modal_standin.token_secret not in (run_dir / "ledger.jsonl").read_text()
    assert settle(modal_standin) == []


def test_pool_reap_ends_a_runs_sandboxes(
    modal_standin: ModalStandin, modal_backend: ModalBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pool.backends.reap import main

    snapshot = modal_backend.build(TEMPLATE)
    gone = modal_backend.create(snapshot, labels={"snapgym.run": "r7"})
    kept = modal_backend.create(snapshot, labels={"snapgym.run": "r8"})
    for key, value in modal_standin.sdk_env.items():
        monkeypatch.setenv(key, value)
    assert main(["--backend", "modal", "--run", "r7", "-o", f"base_image={modal_standin.base_image_id}"]) == 0
    assert str(gone.remote_id) not in running(modal_standin) and str(kept.remote_id) in running(modal_standin)


def test_without_a_token_the_backend_says_which_variables(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for key in ("MODAL_TOKEN_ID", "MODAL_TOKEN_SECRET"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    reason = unavailable_reason("modal")
    assert reason is not None and "MODAL_TOKEN_ID" in reason
    with pytest.raises(ConfigError, match="MODAL_TOKEN_ID"):
        load_backend("modal")


def _task(root: Path, name: str, gpus: int) -> None:
    """A minimal Harbor task; with ``gpus`` it asks for an A10G."""
    for folder in ("environment", "tests", "solution"):
        (root / name / folder).mkdir(parents=True)
    resources = f'gpus = {gpus}\ngpu_types = ["A10G"]\n' if gpus else ""
    (root / name / "task.toml").write_text(f'version = "1.0"\n[environment]\n{resources}network_mode = "no-network"\n')
    (root / name / "instruction.md").write_text("Write done to /app/out.\n")
    (root / name / "environment" / "Dockerfile").write_text("FROM snapgym/host\nWORKDIR /app\n")
    (root / name / "solution" / "solve.sh").write_text("#!/bin/bash\necho done > /app/out\n")
    (root / name / "tests" / "test.sh").write_text(
        "#!/bin/bash\ngrep -qx done /app/out && r=1 || r=0\necho $r > /logs/verifier/reward.txt\n"
    )


def test_one_run_routes_gpu_tasks_to_modal_and_the_rest_to_the_local_backend(
    modal_standin: ModalStandin, tmp_path: Path
) -> None:
    """``gpu_backend={name: modal}``: the task that asks for a GPU runs on Modal with gpu set in the
    request, the other on the run's own backend; both score, and each result names its backend."""
    tasks = tmp_path / "tasks"
    _task(tasks, "cpu-task", 0)
    _task(tasks, "gpu-task", 1)
    run_dir = tmp_path / "run"
    gpu = f"{{name:modal,base_image:'{modal_standin.base_image_id}',registry_file:'{tmp_path / 'images.json'}'}}"
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.run", "suite=dir", f"suite.path={tasks}", "backend=local",
         f"backend.store_dir={tmp_path / 'store'}", f"gpu_backend={gpu}", "progress=false", "benchmark.plots=false",
         f"output_dir={run_dir}", f"hydra.run.dir={tmp_path / 'hydra'}"],
        cwd=Path(__file__).parents[4], env={**os.environ, **modal_standin.sdk_env},
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    results = [r for r in map(json.loads, (run_dir / "ledger.jsonl").read_text().splitlines()) if r["kind"] == "result"]
    backends = {r["task_id"]: r["backend"] for r in results}
    assert backends == {"cpu-task": "local", "gpu-task": "modal"}
    assert all(r["reward"] == 1.0 for r in results)
    gpus = {record.gpu for record in modal_standin.sandboxes().values()}
    assert gpus == {"A10G"}  # every Modal sandbox of the run (build, episode, verifier) asked for it
