"""The Docker backend against a real engine: the contract, limits, labels, orphans, images and failures.

Skipped (with the reason) only when no engine answers; CI starts dockerd and requires it.
"""

from __future__ import annotations

import contextlib
import errno
import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from pool import (
    BackendError,
    BuildError,
    ConfigError,
    DockerBuild,
    FileOperationError,
    Resources,
    SandboxCrashedError,
    Snapshot,
    SnapshotNotFoundError,
    Template,
)
from pool.backends.docker import DockerBackend, DockerSandbox
from pool.errors import HostBrokenError, UnsupportedError
from pool.labels import OWNER, RUN
from pool.testing import check_backend
from pool.verification import VerificationPlan, VerifyMode
from tests.support.backends import backend_missing
from tests.support.fixtures.docker_fixtures import PREFIX, EngineProxy, backend, remove_prefix, rootfs_tarball
from tests.support.fixtures.oci_fixtures import Registry, free_port, push, tiny_image

pytest_plugins = ["tests.support.fixtures.oci_fixtures"]
pytestmark = [pytest.mark.docker, backend_missing("docker")]

WORKSPACE = Template(
    name="docker-tests-workspace",
    setup=["echo start > /workspace/given"],
    workdir="/workspace",
    env={"TASK_VAR": "task"},
)


@pytest.fixture(scope="module")
def docker_backend() -> Iterator[DockerBackend]:
    try:
        with backend() as made:
            yield made
    finally:
        remove_prefix(PREFIX)


@pytest.fixture(scope="module")
def snap(docker_backend: DockerBackend) -> Snapshot:
    return docker_backend.build(WORKSPACE)


@pytest.fixture()
def sandbox(docker_backend: DockerBackend, snap: Snapshot) -> Iterator[DockerSandbox]:
    with docker_backend.create(snap) as made:
        yield made


@pytest.fixture(scope="module")
def tarball(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return rootfs_tarball(tmp_path_factory.mktemp("docker-rootfs"))


def test_passes_check_backend(docker_backend: DockerBackend) -> None:
    check_backend(docker_backend)


def test_capabilities_say_what_the_engine_does(docker_backend: DockerBackend) -> None:
    caps = docker_backend.capabilities
    assert (caps.in_place_restore, caps.memory_snapshot, caps.fork, caps.gpu) == (False, False, True, False)
    assert caps.verifier_isolation == "none"
    # root beside a local engine: the egress proxy reaches into each container's network namespace
    assert (caps.egress_control, caps.egress_audit) == ("proxy", True)
    assert set(caps.network_modes) == {"public", "no-network", "allowlist"}
    assert caps.verification == ("strict",) and caps.bases == ("host", "rootfs", "image", "dockerfile")
    assert caps.limits["memory"].value == "cgroup" and caps.limits["disk"].value in ("tmpfs", "quota")
    userns = "userns" in docker_backend.engine.security
    assert ("user" in caps.isolation) == userns


def test_signature_state_of_an_episode_is_gone_in_the_next(sandbox: DockerSandbox) -> None:
    """A file, a process and an exported variable written in episode N are gone in N+1, episode after episode."""
    for episode in range(3):
        r = sandbox.exec(
            "ls /workspace; pgrep -c sleep; sh -lc 'echo SIG=$SIG'; test -e /tmp/mark && echo mark; echo $TASK_VAR"
        )
        assert r.stdout == "given\n0\nSIG=\ntask\n", (episode, r.stdout, r.stderr)
        sandbox.exec(
            f"echo {episode} > /workspace/leak; echo x > /tmp/mark; echo 'export SIG=1' >> /root/.profile;"
            " (setsid sleep 1000 >/dev/null 2>&1 &)"
        )
        counted = sandbox.exec("pgrep -c sleep")
        assert counted.stdout == "1\n", (episode, counted)
        sandbox.restore()


def test_restore_hands_over_a_new_container_and_the_sandbox_keeps_its_id(
    docker_backend: DockerBackend, sandbox: DockerSandbox
) -> None:
    first = sandbox.container_id
    assert first is not None
    sandbox.restore()
    assert sandbox.container_id != first and sandbox.is_alive
    assert docker_backend.container_state(first).get("Running") is not True  # killed at the hand-off
    labels = docker_backend.api.inspect_container(sandbox.container_id)["Config"]["Labels"]
    assert labels["snapgym.sandbox"] == sandbox.id


def test_labels_are_on_every_container(docker_backend: DockerBackend, snap: Snapshot) -> None:
    with docker_backend.create(snap, labels={RUN: "run-7", "team": "a"}) as sandbox:
        for _ in range(2):
            assert sandbox.container_id is not None
            labels = docker_backend.api.inspect_container(sandbox.container_id)["Config"]["Labels"]
            assert labels[OWNER] == docker_backend.owner and labels[RUN] == "run-7" and labels["team"] == "a"
            assert labels["snapgym.snapshot"] == snap.id and sandbox.labels[OWNER] == docker_backend.owner
            sandbox.restore()
    with pytest.raises(ConfigError, match="label key"):
        docker_backend.create(snap, labels={"bad key!": "x"})


def test_memory_past_the_limit_is_oom_killed(docker_backend: DockerBackend) -> None:
    small = docker_backend.build(Template(name="docker-tests-small", resources=Resources(memory_mb=64)))
    with docker_backend.create(small) as sandbox:
        r = sandbox.exec("python3 -c 'b = bytearray(300 << 20); print(len(b))'", timeout_s=60)
        assert r.exit_code == 137 and "314572800" not in r.stdout, r
        assert sandbox.is_alive and sandbox.exec("echo still here").stdout == "still here\n"


def test_processes_past_the_pids_limit_are_refused(sandbox: DockerSandbox) -> None:
    count = "for f in /sys/fs/cgroup/pids/pids.current /sys/fs/cgroup/pids.current; do [ -r $f ] && read n < $f; done"
    r = sandbox.exec(f"(for i in $(seq 100); do sleep 30 & done) 2>/dev/null; {count}; echo $n", timeout_s=30)
    assert 50 < int(r.stdout) <= 64, r  # pids_limit=64: forks past it failed (only builtins counted here)
    r = sandbox.exec("echo more")
    assert r.stdout == "more\n" or (r.exit_code == 126 and "process limit" in r.stderr), r  # refused as data
    sandbox.restore()
    assert sandbox.exec("pgrep -c sleep").stdout == "0\n"


def test_a_command_the_engine_cannot_start_is_tried_once_more_and_reported_in_its_words(
    sandbox: DockerSandbox,
) -> None:
    # Every pid held while this exec lasts: its loop forks until the limit refuses (the subshell then
    # exits, freeing one pid), and its shell becomes a sleep (no fork). The runtime needs more than one.
    fill = "(for i in $(seq 200); do sleep 60 & done) 2>/dev/null; : > /tmp/filled; exec sleep 60"
    holder = threading.Thread(target=lambda: _ignoring_errors(sandbox.exec, fill, timeout_s=90), daemon=True)
    holder.start()
    deadline = time.monotonic() + 30
    while not _file_exists(sandbox, "/tmp/filled"):  # the engine's archive API: no process started
        assert time.monotonic() < deadline, "the sandbox did not fill its pids"
        time.sleep(0.1)
    since = int(time.time()) - 1
    r = sandbox.exec("echo never-started-marker")
    assert (r.exit_code, r.stdout, r.timed_out) == (126, "", False), r
    assert "process limit" in r.stderr, r  # what the refusal means here
    api, container = sandbox._link.api, sandbox.container_id
    events = api.events(since=since, until=int(time.time()) + 1, filters={"container": container}, decode=True)
    tries = [e for e in events if e.get("Action", "").startswith("exec_create") and "never-started" in e["Action"]]
    if "cannot start the command: fork failed" in r.stderr:  # a pid or two were free: our helper ran, the shell not
        # The helper ran, so it was not started again; a first try may still have met the runtime's own
        # refusal before a pid came free (seen once under load): never more than two.
        assert 1 <= len(tries) <= 2, tries
    else:  # the usual case: the runtime itself could not enter the container
        assert "the container engine could not start the command: OCI runtime exec failed" in r.stderr, r
        assert len(tries) == 2, tries  # nothing ran, so it was started once more before giving up
    sandbox.restore()
    holder.join(timeout=30)
    assert sandbox.exec("echo back").stdout == "back\n"


def test_output_the_client_read_with_the_response_headers_is_kept(
    sandbox: DockerSandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client slow to read the exec's response headers (a loaded machine) finds the command's output
    already in the HTTP reader's buffer, not on the socket docker-py hands over: it is read from there."""
    begin = http.client.HTTPResponse.begin

    def late_begin(response: http.client.HTTPResponse) -> None:
        time.sleep(0.5)  # the helper has run and written everything by now
        begin(response)

    monkeypatch.setattr(http.client.HTTPResponse, "begin", late_begin)
    r = sandbox.exec("echo out; echo err >&2; exit 3")
    assert (r.exit_code, r.stdout, r.stderr) == (3, "out\n", "err\n"), r


def _ignoring_errors(function: Callable[..., object], *args: object, **kwargs: object) -> None:
    with contextlib.suppress(Exception):
        function(*args, **kwargs)


def _file_exists(sandbox: DockerSandbox, path: str) -> bool:
    try:
        sandbox.read_file(path)
    except FileOperationError:
        return False
    return True


def test_a_command_killing_every_process_is_data_not_a_crash(sandbox: DockerSandbox) -> None:
    r = sandbox.exec("kill -9 -1")
    assert r.exit_code == 137 and not r.timed_out
    assert sandbox.is_alive and sandbox.exec("echo alive").stdout == "alive\n"  # PID 1 is the helper: unkillable


def test_background_processes_do_not_hold_the_command(sandbox: DockerSandbox) -> None:
    started = time.monotonic()
    r = sandbox.exec("sleep 30 & echo started")
    assert r.stdout == "started\n" and time.monotonic() - started < 10
    assert sandbox.exec("pgrep -c sleep").stdout == "1\n"  # it runs on, adopted by init


def test_large_stdin_and_capped_output(sandbox: DockerSandbox) -> None:
    data = os.urandom(3 << 20)
    r = sandbox.exec("wc -c", stdin=data)
    assert r.stdout.strip() == str(len(data))
    r = sandbox.exec("head -c 5000000 /dev/zero; echo err >&2", max_output_bytes=4096)
    assert len(r.stdout) == 4096 and r.stdout_truncated and r.stderr == "err\n" and r.ok


def test_file_errors_carry_the_errno(sandbox: DockerSandbox) -> None:
    sandbox.exec("echo data > f && ln -s f link && mkfifo fifo && mkdir d && head -c 5000 /dev/zero > big")
    cases = [
        ("link", {"follow_symlinks": False}, errno.ELOOP),
        ("fifo", {}, errno.EINVAL),
        ("d", {}, errno.EISDIR),
        ("big", {"max_bytes": 100}, errno.EFBIG),
        ("nothing", {}, errno.ENOENT),
    ]
    for path, options, code in cases:
        with pytest.raises(FileOperationError) as caught:
            sandbox.read_file(path, **options)  # type: ignore[arg-type]
        assert caught.value.errno == code, path
    assert sandbox.read_file("link") == b"data\n"
    with pytest.raises(FileOperationError) as caught:
        sandbox.write_file("/workspace/d", b"x")
    assert caught.value.errno == errno.EISDIR
    sandbox.write_file("/workspace/new/deep/file", b"\x00\xff", mode=0o600)
    assert sandbox.exec("stat -c %a new/deep/file").stdout == "600\n"


def test_a_removed_snapshot_image_is_snapshot_not_found(docker_backend: DockerBackend, sandbox: DockerSandbox) -> None:
    sandbox.exec("echo 1 > /workspace/checkpointed")
    checkpoint = sandbox.snapshot()
    assert checkpoint.parent == sandbox.start_snapshot.id and checkpoint.digest.startswith("sha256:")
    docker_backend.api.remove_image(checkpoint.digest, force=True)
    with pytest.raises(SnapshotNotFoundError, match="gone from the Docker engine"):
        docker_backend.create(checkpoint)


def test_a_container_killed_from_outside_is_a_crash_and_restore_recovers(
    docker_backend: DockerBackend, sandbox: DockerSandbox
) -> None:
    assert sandbox.container_id is not None
    docker_backend.api.kill(sandbox.container_id)
    with pytest.raises(SandboxCrashedError):
        sandbox.exec("true")
    sandbox.restore()
    assert sandbox.exec("cat given").stdout == "start\n"


def test_strict_verification_sees_only_the_outputs(sandbox: DockerSandbox, snap: Snapshot, tmp_path: Path) -> None:
    (tmp_path / "test.sh").write_text("echo 1 > /logs/verifier/reward.txt\n")
    sandbox.exec(
        "echo answer > /workspace/out && ln -s /tests/test.sh /workspace/peek && echo /x.so > /etc/ld.so.preload"
        " && mkdir -p /logs/verifier && echo 1 > /logs/verifier/reward.txt && (setsid sleep 1000 >/dev/null 2>&1 &)"
    )
    plan = VerificationPlan(VerifyMode.STRICT, tmp_path, outputs=("/workspace",), known_good=snap)
    report = sandbox.begin_verification(plan)
    assert report.removed_links == ("/workspace/peek -> /tests/test.sh",)
    r = sandbox.exec("ls /workspace; ls -A /logs/verifier; test -e /etc/ld.so.preload || echo clean; pgrep -c sleep")
    assert r.stdout == "given\nout\nclean\n0\n", r


def test_shared_verification_is_refused_unless_asked_for(
    sandbox: DockerSandbox, snap: Snapshot, tmp_path: Path
) -> None:
    """A shared verifier in the agent's container can be beaten by the agent's live processes: off by default."""
    (tmp_path / "test.sh").write_text("echo real\n")
    with pytest.raises(ConfigError, match="shared_verification=True"):
        sandbox.begin_verification(VerificationPlan(VerifyMode.SHARED, tmp_path, known_good=snap))
    with pytest.raises(UnsupportedError, match="toolchain verification is not built on the Docker backend"):
        sandbox.begin_verification(VerificationPlan(VerifyMode.TOOLCHAIN, tmp_path, outputs=("/w",), known_good=snap))
    assert sandbox.exec("echo still the agents").ok


def test_shared_verification_keeps_the_agent_and_refreshes_tests_and_reward(tmp_path: Path) -> None:
    (tmp_path / "test.sh").write_text("echo real\n")
    with backend(shared_verification=True) as shared:
        assert shared.capabilities.verification == ("strict", "shared")
        snap = shared.build(WORKSPACE)
        with shared.create(snap) as sandbox:
            sandbox.exec(
                "mkdir -p /tests /logs/verifier && echo fake > /tests/test.sh && echo 1 > /logs/verifier/reward.txt"
                " && (setsid sleep 1000 >/dev/null 2>&1 &)"
            )
            report = sandbox.begin_verification(VerificationPlan(VerifyMode.SHARED, tmp_path, known_good=snap))
            assert report.notes and "strict" in report.notes[0]  # what does not hold is said
            r = sandbox.exec("cat /tests/test.sh; ls -A /logs/verifier; pgrep -c sleep")
            assert r.stdout == "echo real\n1\n"


def test_a_rootfs_tarball_is_a_base(docker_backend: DockerBackend, tarball: Path) -> None:
    template = Template(name="docker-tests-rootfs", base=str(tarball), setup=["echo built > /data"], workdir="/")
    snap = docker_backend.build(template)
    assert docker_backend.build(template).digest == snap.digest
    with docker_backend.create(snap) as sandbox:
        r = sandbox.exec("cat /data /etc/os-release; id -u; ls /usr/bin/python3 2>&1")
        assert r.stdout.startswith("built\nID=snapgym-docker-test\n0\n") and "No such file" in r.stdout


def test_image_archives_are_bases(docker_backend: DockerBackend, tarball: Path, tmp_path: Path) -> None:
    """``docker-archive:`` is loaded by the engine, ``oci-archive:`` copied in by skopeo."""
    image_id = docker_backend.bases.get(str(tarball)).image_id
    saved = tmp_path / "saved.tar"
    with saved.open("wb") as f:
        for chunk in docker_backend.api.get_image(image_id):
            f.write(chunk)
    bases = [f"docker-archive:{saved}"]
    if shutil.which("skopeo"):
        oci = tmp_path / "oci.tar"
        subprocess.run(["skopeo", "copy", f"docker-archive:{saved}", f"oci-archive:{oci}:tiny"], check=True)
        bases.append(f"oci-archive:{oci}:tiny")
    for index, base in enumerate(bases):
        snap = docker_backend.build(Template(name=f"docker-tests-archive-{index}", base=base, workdir="/"))
        with docker_backend.create(snap) as sandbox:
            assert sandbox.exec("cat /etc/os-release").stdout == "ID=snapgym-docker-test\n", base


def test_a_disk_limit_no_way_can_hold_is_refused_at_once_by_name(tmp_path: Path) -> None:
    """An engine reached over TCP may be another machine's: no tmpfs of ours can hold its layers,
    and this engine's overlay2 on ext4 has no quota; the backend refuses rather than run unlimited."""
    proxy = EngineProxy(tmp_path, tcp=True)
    try:
        with pytest.raises(ConfigError, match=r"cannot limit a sandbox's disk to 1024 MiB.*disk_limit_mb=null"):
            DockerBackend(base_url=proxy.url, prewarm=False, image_prefix=PREFIX)
        with DockerBackend(base_url=proxy.url, prewarm=False, image_prefix=PREFIX, disk_limit_mb=None) as made:
            assert made.capabilities.limits["disk"].value == "none"  # asked for: said, not hidden
            with pytest.raises(ConfigError, match="storage_mb=32, which this Docker backend cannot give"):
                made.build(Template(name="docker-tests-storage", resources=Resources(storage_mb=32)))
    finally:
        proxy.vanish()


def test_a_dockerfile_is_built_by_the_engines_builder(
    docker_backend: DockerBackend, tarball: Path, tmp_path: Path
) -> None:
    (tmp_path / "hello.txt").write_text("hello\n")
    build = DockerBuild(
        dockerfile="FROM tiny/base:1\nRUN echo built > /built && mkdir -p /app\nCOPY hello.txt /app/\n"
        "ENV GREETING=hi\nWORKDIR /app\n",
        context=str(tmp_path),
        image_sources={"tiny/base": str(tarball)},
    )
    template = Template(name="docker-tests-dockerfile", dockerfile=build, setup=["echo setup > /app/setup"])
    snap = docker_backend.build(template)
    assert (snap.workdir, snap.env["GREETING"]) == ("/app", "hi")
    assert docker_backend.build(template).digest == snap.digest  # a cache hit
    history = " ".join(str(h.get("CreatedBy")) for h in docker_backend.api.history(snap.digest))
    assert "echo built > /built" in history  # the engine's builder ran the RUN step
    with docker_backend.create(snap) as sandbox:
        assert sandbox.exec("cat /built hello.txt setup; echo $GREETING").stdout == "built\nhello\nsetup\nhi\n"


def test_a_prebuilt_image_is_used_instead_of_the_dockerfile(
    docker_backend: DockerBackend, tarball: Path, tmp_path: Path
) -> None:
    base = docker_backend.bases.get(str(tarball))
    docker_backend.api.tag(base.image_id, f"{PREFIX}/prebuilt", "1")
    build = DockerBuild(
        dockerfile="FROM tiny/base:1\nRUN exit 1\n", context=str(tmp_path), prebuilt=f"{PREFIX}/prebuilt:1"
    )
    snap = docker_backend.build(Template(name="docker-tests-prebuilt", dockerfile=build, workdir="/"))
    with docker_backend.create(snap) as sandbox:
        assert sandbox.exec("cat /etc/os-release").stdout == "ID=snapgym-docker-test\n"


def test_a_dockerfile_from_the_host_runs_its_steps_over_the_host_view(
    docker_backend: DockerBackend, tmp_path: Path
) -> None:
    build = DockerBuild(
        dockerfile="FROM snapgym/host\nRUN mkdir -p /opt/x && python3 -c \"open('/opt/x/f', 'w').write('ok')\"\n"
        "WORKDIR /opt/x\n",
        context=str(tmp_path),
    )
    snap = docker_backend.build(Template(name="docker-tests-host-dockerfile", dockerfile=build))
    assert snap.base == "host" and snap.workdir == "/opt/x"
    with docker_backend.create(snap) as sandbox:
        assert sandbox.exec("cat f").stdout == "ok"


def test_a_failing_dockerfile_step_is_a_build_error_with_its_output(
    docker_backend: DockerBackend, tarball: Path, tmp_path: Path
) -> None:
    build = DockerBuild(
        dockerfile="FROM tiny/base:1\nRUN echo step-output-7 && exit 3\n",
        context=str(tmp_path),
        image_sources={"tiny/base": str(tarball)},
    )
    with pytest.raises(BuildError, match="step-output-7"):
        docker_backend.build(Template(name="docker-tests-broken-dockerfile", dockerfile=build))


def test_an_image_the_engine_cannot_get_is_a_clear_error(docker_backend: DockerBackend, tmp_path: Path) -> None:
    missing = "127.0.0.1:9/snapgym/no-such-image:1"
    with pytest.raises(ConfigError, match="docker load"):
        docker_backend.build(Template(name="docker-tests-missing", base=missing))
    build = DockerBuild(dockerfile=f"FROM {missing}\nRUN true\n", context=str(tmp_path))
    with pytest.raises(ConfigError, match="docker save"):
        docker_backend.build(Template(name="docker-tests-missing-from", dockerfile=build))
    with pytest.raises(ConfigError, match="does not exist"):
        docker_backend.build(Template(name="docker-tests-missing-archive", base="docker-archive:/no/such.tar"))


def test_no_engine_is_a_clear_reason_and_error(tmp_path: Path) -> None:
    url = f"unix://{tmp_path}/no-engine.sock"
    reason = DockerBackend.unavailable_reason(base_url=url)
    assert reason is not None and "start dockerd or set DOCKER_HOST" in reason
    with pytest.raises(BackendError, match="start dockerd or set DOCKER_HOST"):
        DockerBackend(base_url=url)


def test_an_engine_that_dies_makes_the_backend_unhealthy(snap: Snapshot, tmp_path: Path) -> None:
    import docker

    proxy = EngineProxy(tmp_path)
    made = DockerBackend(base_url=proxy.url, prewarm=False, image_prefix=PREFIX, memory_limit_mb=256)
    try:
        sandbox = made.create(snap)
        assert made.health is None and sandbox.exec("echo up").stdout == "up\n"
        proxy.vanish()
        assert made.health is not None and "start dockerd" in made.health
        with pytest.raises(HostBrokenError):
            sandbox.exec("true")
    finally:
        made.close()
        client = docker.from_env()
        for container in client.containers.list(all=True, filters={"label": f"{OWNER}={made.owner}"}):
            container.remove(force=True)
        client.close()


def test_reap_orphans_removes_the_containers_of_a_dead_process(docker_backend: DockerBackend, snap: Snapshot) -> None:
    script = (
        "import time\nfrom pool.backends.docker import DockerBackend\n"
        f"b = DockerBackend(image_prefix={PREFIX!r}, prewarm=False)\n"
        f"s = b.create(b.get_snapshot({snap.id!r}), labels={{'snapgym.run': 'orphaned'}})\n"
        "print(s.container_id, flush=True)\ntime.sleep(600)\n"
    )
    container = killed_after_its_line(script)
    assert docker_backend.container_state(container).get("Running") is True  # a SIGKILL cleans nothing up
    assert docker_backend.reap_orphans() >= 1
    assert docker_backend.container_state(container) == {}


def checkpoints_of_a_killed_process(snap: Snapshot, run: str | None) -> Snapshot:
    """A child process takes a checkpoint of a sandbox (of ``run``, if given) and is SIGKILLed."""
    labels = {RUN: run} if run else {}
    script = (
        "import json, time\nfrom pool.backends.docker import DockerBackend\n"
        f"b = DockerBackend(image_prefix={PREFIX!r}, prewarm=False)\n"
        f"s = b.create(b.get_snapshot({snap.id!r}), labels={labels!r})\n"
        "s.exec('echo kept > /workspace/checkpointed')\n"
        "print(json.dumps(s.snapshot().to_dict()), flush=True)\ntime.sleep(600)\n"
    )
    return Snapshot.from_dict(json.loads(killed_after_its_line(script)))


def killed_after_its_line(script: str) -> str:
    """Run a Python ``script`` in a child process, read the first line it prints, then SIGKILL it."""
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=Path.cwd())
    try:
        assert child.stdout is not None
        line = child.stdout.readline().strip()
        assert line, "the child printed nothing"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    return line


def image_exists(made: DockerBackend, image_id: str) -> bool:
    try:
        made.api.inspect_image(image_id)
    except Exception:
        return False
    return True


def test_a_killed_runs_checkpoint_waits_for_its_resume_which_adopts_it(
    docker_backend: DockerBackend, snap: Snapshot
) -> None:
    """A checkpoint of a run outlives its killed maker (reap_orphans keeps it, unlike one of no run); the
    resume that starts a sandbox of that run at it adopts it, and removes it when its backend closes."""
    of_run = checkpoints_of_a_killed_process(snap, "durable-run")
    of_no_run = checkpoints_of_a_killed_process(snap, None)
    docker_backend.reap_orphans()
    assert image_exists(docker_backend, of_run.digest) and not image_exists(docker_backend, of_no_run.digest)
    with backend() as resumed, resumed.create(of_run, labels={RUN: "durable-run"}) as sandbox:
        assert sandbox.read_file("/workspace/checkpointed") == b"kept\n"
    assert not image_exists(docker_backend, of_run.digest)


def test_reap_by_run_removes_the_checkpoints_a_killed_run_kept(docker_backend: DockerBackend, snap: Snapshot) -> None:
    from pool.backends.reap import main

    kept = checkpoints_of_a_killed_process(snap, "never-resumed")
    other = checkpoints_of_a_killed_process(snap, "still-resumable")
    try:
        assert main(["--backend", "docker", "--run", "never-resumed", "--dry-run"]) == 0
        assert image_exists(docker_backend, kept.digest)
        assert docker_backend.reap_run("never-resumed") == [f"checkpoint {kept.digest}"]
        assert not image_exists(docker_backend, kept.digest) and image_exists(docker_backend, other.digest)
    finally:
        docker_backend.reap_run("still-resumable")


def test_close_removes_every_container_of_the_backend(snap: Snapshot) -> None:
    with backend() as made:
        made.fork(snap, 2)
        owner = made.owner
    remaining = made_containers(owner)
    assert remaining == [], remaining


def made_containers(owner: str) -> list[str]:
    import docker

    client = docker.from_env()
    try:
        return [c.id for c in client.containers.list(all=True, filters={"label": f"{OWNER}={owner}"})]
    finally:
        client.close()


def test_reap_by_run_removes_every_container_of_that_run_only(docker_backend: DockerBackend, snap: Snapshot) -> None:
    """``python -m pool.backends.reap --backend docker --run ID``: what a run left, wherever its process was."""
    from pool.backends.reap import main

    mine = docker_backend.create(snap, labels={"snapgym.run": "reap-me"})
    other = docker_backend.create(snap, labels={"snapgym.run": "keep-me"})
    try:
        assert main(["--backend", "docker", "--run", "reap-me", "--dry-run"]) == 0
        assert mine.is_alive
        found = docker_backend.reap_run("reap-me")
        assert mine.container_id in found and other.container_id not in found
        assert not mine.is_alive and other.is_alive
    finally:
        mine.close()
        other.close()


def test_a_task_whose_prebuilt_image_and_from_image_both_fail_names_both(tmp_path: Path) -> None:
    """Either image runs the task, so the error names both: the prebuilt ``docker_image`` tried first,
    and the Dockerfile's ``FROM``, each with why the engine could not get it."""
    down = f"127.0.0.1:{free_port()}"
    prebuilt, base = f"{down}/team/prebuilt:1", f"{down}/team/base:1"
    build = DockerBuild(dockerfile=f"FROM {base}\nRUN true\n", context=str(tmp_path), prebuilt=prebuilt)
    with backend() as docker, pytest.raises(ConfigError) as raised:
        docker.build(Template(name="neither", dockerfile=build))
    message = str(raised.value)
    assert base in message and "cannot pull it" in message
    assert f"prebuilt docker_image {prebuilt} could not be had either" in message


def test_an_image_is_pulled_through_a_registry_mirror(tmp_path: Path, mirror_registry: Registry) -> None:
    """``registry.mirrors``: an image the engine lacks and its registry cannot give (nothing listens
    there) comes from the mirror, and is tagged with the name the task used, so the next build finds
    it; a registry with no mirror still says how to provide the image."""
    name = uuid.uuid4().hex[:12]
    push(tiny_image(tmp_path, name).ref("latest"), mirror_registry, f"team/{name}:1", fmt="v2s2")
    down = f"127.0.0.1:{free_port()}"
    reference = f"{down}/team/{name}:1"
    with backend() as plain, pytest.raises(ConfigError, match=r"cannot pull it.*registry mirror"):
        plain.bases.image(reference)  # what a template's base or a Dockerfile's FROM goes through
    with backend(registry={"mirrors": {down: [mirror_registry.host]}}) as mirrored:
        pulled = mirrored.bases.image(reference)
        assert mirrored.api.inspect_image(reference)["Id"] == pulled.image_id  # tagged as the task named it
        assert "TINY=" + name in mirrored.api.inspect_image(reference)["Config"]["Env"]
        assert mirrored.bases.image(reference).image_id == pulled.image_id  # found again, not pulled
    with pytest.raises(ConfigError, match="takes only 'mirrors'"):
        DockerBackend(registry={"credentials": {}})
