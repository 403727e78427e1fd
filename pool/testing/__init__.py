"""The conformance suite every backend must pass, like Gymnasium's ``check_env``.

>>> from pool import load_backend
>>> from pool.testing import check_backend
>>> check_backend(load_backend("local"))   # raises ConformanceError naming the failed check

The checks follow the backend's :class:`~pool.capabilities.Capabilities`: each
verification mode it declares is verified, fork is checked when it declares
fork, every limit it says it enforces is pushed past, and a GPU request is
refused by a backend without GPUs.
"""

from __future__ import annotations

import errno
import functools
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from pool.capabilities import Capabilities, ChangesSource, Enforcement
from pool.contract import Backend, Sandbox
from pool.errors import (
    BuildError,
    ConfigError,
    FileOperationError,
    SandboxClosedError,
    SnapgymError,
    UnsupportedError,
)
from pool.labels import OWNER
from pool.network.policy import NetworkPolicy, Phase
from pool.resources import Resources
from pool.snapshots import Snapshot
from pool.templates import Template
from pool.testing.expect import ConformanceError
from pool.testing.expect import expect as _expect
from pool.testing.hard import check_hard_inputs
from pool.verification import REWARD_DIR, TESTS_PATH, VerificationPlan, VerifyMode

CONFORMANCE_TEMPLATE = Template(
    name="snapgym-conformance",
    setup=["echo hi > /workspace/a", "date +%s%N > /workspace/stamp"],
    workdir="/workspace",
    env={"SNAPGYM_CONFORMANCE": "1"},
    healthcheck="test -f /workspace/a",
)


def check_backend(backend: Backend, *, template: Template = CONFORMANCE_TEMPLATE) -> None:
    """Run every conformance check against ``backend``; raise on the first failure.

    The hard inputs (:mod:`pool.testing.hard`) run in a sandbox of it too. The template must
    produce ``/workspace/a`` containing ``hi`` and a
    ``/workspace/stamp`` that differs between two real builds.
    """
    capabilities = backend.capabilities
    _expect(isinstance(capabilities, Capabilities), "capabilities", "must be a Capabilities")
    _expect(backend.health is None, "health", f"a new backend must be healthy, got {backend.health!r}")
    snap = check_build_cache(backend, template)
    check_build_failure(backend)
    check_labels(backend, snap)
    with backend.create(snap) as sandbox:
        for check in (check_exec, check_files, check_hard_inputs, check_episode_isolation):
            check(sandbox)
        check_snapshot_restore(backend, sandbox, snap)
        sandbox.restore(snap)
        for mode in capabilities.verification:
            check_verification(sandbox, snap, VerifyMode.parse(mode))
        sandbox.restore(snap)
        check_network(sandbox, capabilities)
        sandbox.restore(snap)
        check_changes(sandbox, capabilities)
        sandbox.restore(snap)
        check_shell_session(sandbox, capabilities)
    if capabilities.fork:
        check_fork(backend, snap)
    check_resources(backend, template)
    check_close(backend, snap)
    _expect(isinstance(backend.reap_orphans(), int), "reap_orphans", "must return how many runs it reaped")


def check_build_cache(backend: Backend, template: Template) -> Snapshot:
    """A second build of the same template is a cache hit: same id, same content."""
    first = backend.build(template)
    second = backend.build(template)
    _expect(first.id == second.id, "build cache", "the same template gave two snapshot ids")
    _expect(first.digest == second.digest, "build cache", "setup ran again on the second build")
    _expect(bool(first.digest), "snapshot digest", "a snapshot must carry a digest")
    return first


def check_build_failure(backend: Backend) -> None:
    """A failing setup step fails the build, with the step's output in the error."""
    marker = f"conformance-failure-{time.time_ns()}"
    try:
        backend.build(Template(name="snapgym-conformance-broken", setup=[f"echo {marker}; exit 7"]))
    except BuildError as exc:
        _expect(marker in str(exc), "build failure", "the error must hold the failing step's output")
        return
    raise ConformanceError("build failure: a setup step exiting 7 did not fail the build")


def check_labels(backend: Backend, snap: Snapshot) -> None:
    """A sandbox has an id and carries the labels it was given plus its owner's."""
    with backend.create(snap, labels={"snapgym.run": "conformance", "team": "a"}) as sandbox:
        _expect(isinstance(sandbox.id, str) and bool(sandbox.id), "sandbox id", repr(sandbox.id))
        found = dict(sandbox.labels)
        _expect(found.get("snapgym.run") == "conformance" and found.get("team") == "a", "labels", repr(found))
        _expect(bool(found.get(OWNER)), "labels", f"every sandbox carries {OWNER}")
    _expect_raises(lambda: backend.create(snap, labels={"bad key!": "x"}), ConfigError, "invalid label key")


def check_resources(backend: Backend, template: Template) -> None:
    """Limits the backend says it enforces hold per snapshot; GPUs are refused without GPUs."""
    capabilities = backend.capabilities
    if not capabilities.gpu:
        gpu = Template(name="snapgym-conformance-gpu", resources=Resources(gpus=1))
        _expect_raises(lambda: backend.build(gpu), ConfigError, "a GPU asked of a backend without GPUs")
    limited = Template(
        name="snapgym-conformance-limits",
        base=template.base,
        workdir="/workspace",
        resources=Resources(memory_mb=96, storage_mb=32),
    )
    snap = backend.build(limited)
    _expect(snap.resources.memory_mb == 96, "resources", "the snapshot keeps the template's resources")
    _expect(all(field.split("=")[0] in ("memory_mb", "storage_mb") for field in snap.unapplied), "resources",
            f"only what was asked is reported as not applied: {snap.unapplied}")  # fmt: skip

    def held(limit: str, field: str) -> bool:  # enforced, and (a provider's) applied to this template
        return capabilities.limits.get(limit, Enforcement.NONE).is_enforced and not any(
            text.startswith(f"{field}=") for text in snap.unapplied
        )

    with backend.create(snap) as sandbox:
        if held("memory", "memory_mb"):
            r = sandbox.exec("python3 -c 'b = bytearray(400 << 20); print(len(b))'", timeout_s=60)
            _expect(r.exit_code != 0 and "419430400" not in r.stdout, "memory limit", f"400 MiB fit in 96: {r!r}")
            sandbox.restore()
        if held("disk", "storage_mb"):
            r = sandbox.exec("head -c 64000000 /dev/zero > /workspace/big", timeout_s=60)
            _expect(r.exit_code != 0, "disk limit", "64 MB were written to a 32 MiB sandbox")


def check_exec(sandbox: Sandbox) -> None:
    """Exit codes, separate streams, env, cwd, stdin, timeouts, caps, bytes-safety."""
    r = sandbox.exec("cat a; echo oops >&2; exit 3", timeout_s=10)
    _expect((r.exit_code, r.stdout, r.stderr) == (3, "hi\n", "oops\n"), "exec streams", repr(r))
    _expect(not r.timed_out and r.duration_s >= 0, "exec result", repr(r))
    r = sandbox.exec("echo $SNAPGYM_CONFORMANCE $EXTRA; pwd", env={"EXTRA": "x"}, cwd="/tmp")
    _expect(r.stdout == "1 x\n/tmp\n", "exec env/cwd", repr(r.stdout))
    r = sandbox.exec("cat", stdin=b"piped\n")
    _expect(r.stdout == "piped\n", "exec stdin", repr(r.stdout))
    r = sandbox.exec("cat")
    _expect(r.ok and r.stdout == "", "exec without stdin gets EOF", repr(r))
    started = time.monotonic()
    r = sandbox.exec("(sleep 30 &) ; echo started", timeout_s=25)
    _expect(r.ok and r.stdout == "started\n" and time.monotonic() - started < 15,
            "exec returns when the shell does, not when a background process it left ends", repr(r))  # fmt: skip
    started = time.monotonic()
    r = sandbox.exec("(setsid sleep 60 &) ; sleep 60", timeout_s=0.5)
    _expect(r.timed_out and time.monotonic() - started < 10, "exec timeout", repr(r))
    r = sandbox.exec("ps -eo args 2>/dev/null | grep -c '^sleep 60' || true")
    _expect(r.stdout.strip() in ("0", ""), "timeout kills setsid children", r.stdout)
    r = sandbox.exec("head -c 100000 /dev/zero | tr '\\0' x", max_output_bytes=1000)
    _expect(len(r.stdout) == 1000 and r.stdout_truncated, "output cap", f"{len(r.stdout)} chars")


def check_files(sandbox: Sandbox) -> None:
    """Binary-safe files in and out; parents created; missing files are errors."""
    payload = bytes(range(256)) * 3
    sandbox.write_file("/workspace/sub/dir/bin", payload)
    _expect(sandbox.read_file("/workspace/sub/dir/bin") == payload, "file round trip")
    sandbox.write_file("rel.txt", "text")
    _expect(sandbox.exec("cat /workspace/rel.txt").stdout == "text", "relative paths use workdir")
    _expect_raises(lambda: sandbox.read_file("/no/such/file"), FileOperationError, "missing file")
    try:
        sandbox.read_file("/no/such/file")
    except FileOperationError as exc:  # the verifier tells "no reward file" from "a bad one" by it
        _expect(exc.errno == errno.ENOENT, "a missing file's errno is ENOENT", repr(exc.errno))
    _expect_raises(lambda: sandbox.read_file("/workspace"), FileOperationError, "reading a directory")


def check_episode_isolation(sandbox: Sandbox) -> None:
    """Files, processes and shell state of one episode are gone after restore."""
    sandbox.exec(
        "echo x > /tmp/leak; echo x > /dev/shm/leak; echo x > /workspace/leak; "
        "echo 'export LEAK=1' >> /root/.profile; (setsid sleep 1000 >/dev/null 2>&1 &)"
    )
    sandbox.restore()
    r = sandbox.exec(
        "ls /tmp/leak /dev/shm/leak /workspace/leak 2>/dev/null; "
        "sh -lc 'echo LEAK=$LEAK'; ps -eo args 2>/dev/null | grep '^sleep 1000' || true"
    )
    _expect(r.stdout == "LEAK=\n", "episode isolation", f"state survived restore: {r.stdout!r}")


def check_network(sandbox: Sandbox, capabilities: Capabilities) -> None:
    """A no-network policy lets nothing out; with an audit, the attempt is on record; a restore ends
    the policy and the record; a policy the backend cannot enforce is refused."""
    for mode in ("public", "allowlist"):
        if mode not in capabilities.network_modes:
            policy = NetworkPolicy.public() if mode == "public" else NetworkPolicy.allowlist(["example.com"])
            refused = functools.partial(sandbox.set_network, policy, phase=Phase.AGENT)
            _expect_raises(refused, UnsupportedError, "network")
    env = sandbox.set_network(NetworkPolicy.offline(), phase=Phase.AGENT)
    probe = "curl -sS -m 10 -o /dev/null -w '%{http_code}' http://blocked.invalid/ 2>&1; echo \" rc=$?\""
    r = sandbox.exec(f"command -v curl >/dev/null || exit 99; {probe}")
    if r.exit_code == 99:
        return  # no curl in the template: nothing to probe with
    _expect(" rc=0" not in r.stdout or "403" in r.stdout, "network", f"no-network let a request out: {r.stdout!r}")
    if capabilities.egress_audit:
        _expect(bool(env), "network", "set_network must give the proxy's variables")
        log = sandbox.network_log()
        hosts = [(c.host, c.verdict) for c in log.connections]
        _expect(("blocked.invalid", "denied") in hosts, "network audit", f"the refused attempt is missing: {hosts}")
    sandbox.restore()
    r = sandbox.exec("echo ${HTTP_PROXY:-none}")
    _expect(r.stdout.strip() == "none", "network", f"the proxy outlived restore(): {r.stdout!r}")
    _expect(not sandbox.network_log().connections, "network audit", "records outlived restore()")


def check_changes(sandbox: Sandbox, capabilities: Capabilities) -> None:
    """A sandbox lists what its episode added, changed and removed, and a restore starts the list
    afresh; a backend that cannot list them says so."""
    if capabilities.changes == ChangesSource.NONE:
        _expect_raises(lambda: sandbox.changes(), UnsupportedError, "changes")
        return
    _expect(not sandbox.changes().counts.get("added"), "changes", "a fresh sandbox lists changes")
    sandbox.exec("echo new > /workspace/new; echo more >> /workspace/a; rm /workspace/stamp; mkdir -p /workspace/d/e")
    found = sandbox.changes()
    _expect(found.source == capabilities.changes, "changes", f"source {found.source!r}")
    added = {path.rstrip("/") for path in found.added}  # an engine cannot tell an empty folder from a file
    _expect({"/workspace/new", "/workspace/d", "/workspace/d/e"} <= added, "changes", f"added {found.added}")
    _expect(found.changed == ("/workspace/a",), "changes", f"changed {found.changed}")
    _expect(found.removed == ("/workspace/stamp",), "changes", f"removed {found.removed}")
    sandbox.restore()
    found = sandbox.changes()
    _expect(not (found.added or found.changed or found.removed), "changes", f"outlived restore(): {found}")


def check_shell_session(sandbox: Sandbox, capabilities: Capabilities) -> None:
    """One shell keeps its directory and variables from command to command, a timeout ends only
    what the timed-out command started, and a restore starts a new shell; a backend without a
    session says so."""
    if not capabilities.shell_session:
        _expect_raises(lambda: sandbox.shell("true"), UnsupportedError, "shell session")
        return
    sandbox.shell("cd /tmp; KEPT=1; nohup sleep 1001 >/dev/null 2>&1 &")
    r = sandbox.shell("pwd; echo $KEPT")
    _expect(r.stdout == "/tmp\n1\n", "shell session", f"state did not carry over: {r.stdout!r}")
    r = sandbox.shell("sleep 1002", timeout_s=0.5)
    _expect(r.timed_out, "shell session", "a command past its timeout was not stopped")
    r = sandbox.exec("ps -eo args 2>/dev/null | grep '^sleep 100[12]' || true")
    _expect(
        r.stdout == "sleep 1001\n", "shell session", f"a timeout must end only its command's processes: {r.stdout!r}"
    )
    sandbox.restore()
    r = sandbox.shell("pwd; echo ${KEPT:-unset}")
    _expect(r.stdout == "/workspace\nunset\n", "shell session", f"the shell outlived restore(): {r.stdout!r}")


def check_snapshot_restore(backend: Backend, sandbox: Sandbox, snap: Snapshot) -> None:
    """Mid-episode snapshots are immutable; restore goes to exactly the chosen one."""
    _expect(sandbox.start_digest == snap.digest, "start digest", "must equal the snapshot's digest")
    sandbox.write_file("/workspace/b", b"\x00\xff")
    mid = sandbox.snapshot()
    _expect(mid.digest != snap.digest, "snapshot digest", "a changed state must change the digest")
    sandbox.write_file("/workspace/c", b"after")
    sandbox.restore(snap)
    _expect(sandbox.exec("ls /workspace").stdout == "a\nstamp\n", "restore", "files of the episode remain")
    sandbox.restore(mid)
    _expect(sandbox.exec("ls /workspace").stdout == "a\nb\nstamp\n", "restore to a mid snapshot")
    _expect(sandbox.start_digest == mid.digest, "start digest after restore")


def check_verification(sandbox: Sandbox, snap: Snapshot, mode: VerifyMode) -> None:
    """begin_verification: the verifier's /tests and reward directory, the agent's processes and files per mode."""
    with tempfile.TemporaryDirectory(prefix="snapgym-conformance-tests-") as tests:
        Path(tests, "test.sh").write_text("echo 1 > /logs/verifier/reward.txt\n")
        sandbox.exec(
            f"mkdir -p {REWARD_DIR} /etc/agent && echo forged > {REWARD_DIR}/reward.txt && echo out > /workspace/out"
            " && echo mine > /etc/agent/conf && (setsid sleep 1000 >/dev/null 2>&1 &)"
            # the agent's turn ends with the process running (setsid may not have exec'd sleep yet)
            " && for i in $(seq 100); do ps -eo args 2>/dev/null | grep -q '^sleep 1000' && break; sleep 0.05; done"
        )
        outputs = ("/workspace",) if mode.is_separate else ()
        report = sandbox.begin_verification(VerificationPlan(mode, Path(tests), outputs=outputs, known_good=snap))
        _expect(report.mode is mode, f"{mode.value} verification report")
        r = sandbox.exec(
            f"ls -A {REWARD_DIR}; cat {TESTS_PATH}/test.sh; cat /workspace/out; cat /etc/agent/conf 2>/dev/null;"
            " ps -eo args 2>/dev/null | grep -c '^sleep 1000'"
        )
        # toolchain: /etc/agent is a new folder of a package's own, grafted (pool.verification.installs); no process
        agent_side = {VerifyMode.SHARED: "mine\n1\n", VerifyMode.TOOLCHAIN: "mine\n0\n"}.get(mode, "0\n")
        want = f"echo 1 > {REWARD_DIR}/reward.txt\nout\n{agent_side}"
        _expect(r.stdout == want, f"{mode.value} verification", f"the verifier saw {r.stdout!r}, not {want!r}")
        sandbox.restore(snap)
    _expect(sandbox.exec("ls /workspace").stdout == "a\nstamp\n", f"restore after {mode.value} verification")


def check_fork(backend: Backend, snap: Snapshot) -> None:
    """n forks start at the same state and do not see each other's changes."""
    children = backend.fork(snap, 3)
    try:
        _expect(len(children) == 3, "fork count")
        _expect(len({c.start_digest for c in children}) == 1, "fork digests")
        children[0].write_file("/workspace/only-here", b"1")
        seen = [c.exec("ls /workspace/only-here 2>/dev/null").stdout for c in children[1:]]
        _expect(seen == ["", ""], "fork isolation", repr(seen))
    finally:
        for child in children:
            child.close()


def check_close(backend: Backend, snap: Snapshot) -> None:
    """close() is idempotent and a closed sandbox refuses work."""
    sandbox = backend.create(snap)
    sandbox.close()
    sandbox.close()
    _expect(sandbox.is_closed and not sandbox.is_alive, "closed state")
    _expect_raises(lambda: sandbox.exec("true"), SandboxClosedError, "exec after close")


def _expect_raises(action: Callable[[], object], error: type[SnapgymError], check: str) -> None:
    try:
        action()
    except error:
        return
    raise ConformanceError(f"{check}: expected {error.__name__}")
