"""The Modal stand-in (tests/backends/cloud/modal/standin.py) answers the real, unmodified modal SDK the way Modal
does, over local sandboxes: what a Modal backend's offline tests stand on."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import modal
import pytest
from modal.exception import (
    AlreadyExistsError,
    AuthError,
    ConflictError,
    NotFoundError,
    ResourceExhaustedError,
    SandboxFilesystemDirectoryNotEmptyError,
    SandboxFilesystemIsADirectoryError,
    SandboxFilesystemNotADirectoryError,
    SandboxFilesystemNotFoundError,
    SandboxFilesystemPathAlreadyExistsError,
    SandboxTerminatedError,
    SandboxTimeoutError,
    ServiceError,
    UnimplementedError,
)
from modal.types import FileType

from tests.backends.cloud.modal.standin import JWT_MARKER, TOKEN_SECRET_MARKER, ModalStandin

pytest_plugins = ["tests.backends.cloud.modal.standin"]


def wait_for(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


class Session:
    """A client, an app and the base image of one stand-in, and the calls every test makes."""

    def __init__(self, standin: ModalStandin, app_name: str = "snapgym-tests") -> None:
        self.standin = standin
        self.client = standin.client()
        self.app = modal.App.lookup(app_name, create_if_missing=True, client=self.client)
        self.base = modal.Image.from_id(standin.base_image_id, client=self.client)

    def create(self, *args: str, image: modal.Image | None = None, **options: Any) -> modal.Sandbox:
        return modal.Sandbox.create(*args, app=self.app, image=image or self.base, client=self.client, **options)

    def listed(self, tags: dict[str, str] | None = None) -> set[str]:
        return {sb.object_id for sb in modal.Sandbox.list(app_id=self.app.app_id, tags=tags, client=self.client)}

    def rpcs(self, name: str) -> list[str]:
        """The statuses answered to ``name``, in order."""
        return [r.status for r in self.standin.requests if r.rpc == name]


def run(sb: modal.Sandbox, *argv: str, **options: Any) -> str:
    process = sb.exec(*argv, **options)
    out: str = process.stdout.read()
    assert process.wait() == 0, process.stderr.read()
    return out


@pytest.fixture
def session(modal_standin: ModalStandin) -> Session:
    return Session(modal_standin)


def test_commands_files_snapshots_listing_and_terminate(session: Session) -> None:
    sb = session.create(
        tags={"pool": "p1"}, env={"GLOBAL": "g"}, workdir="/work", timeout=60, cpu=1.5, memory=512, block_network=True
    )
    p = sb.exec("bash", "-c", "echo $GLOBAL $ONE; pwd; echo oops >&2; exit 3", env={"ONE": "1"})
    assert (p.stdout.read(), p.stderr.read(), p.wait()) == ("g 1\n/work\n", "oops\n", 3)
    assert run(sb, "pwd", workdir="/tmp") == "/tmp\n"
    upper = sb.exec("tr", "a-z", "A-Z")
    upper.stdin.write(b"hello ")
    upper.stdin.drain()
    upper.stdin.write("stdin")
    upper.stdin.write_eof()
    upper.stdin.drain()
    assert (upper.stdout.read(), upper.wait()) == ("HELLO STDIN", 0)
    assert ".modal-standin" not in run(sb, "ls", "-A", "/tmp")  # the stdin relay leaves nothing behind

    fs = sb.filesystem
    blob = bytes(range(256)) * 64
    fs.write_bytes(blob, "/work/data/blob.bin")
    fs.write_text("before", "/work/state.txt")
    fs.make_directory("/work/data/sub")
    assert fs.read_bytes("/work/data/blob.bin") == blob
    assert [(e.name, e.type) for e in fs.list_files("/work/data")] == [
        ("blob.bin", FileType.FILE),
        ("sub", FileType.DIRECTORY),
    ]
    assert fs.stat("/work/data/blob.bin").size == len(blob)
    write = next(c for c in session.standin.commands if "WriteFile" in c.argv[-1])
    assert (write.argv[0], write.stdin_bytes, write.exit_code) == ("/__modal/.bin/modal-sandbox-fs-tools", len(blob), 0)
    assert run(sb, "cat", "state.txt") == "before"

    image = sb.snapshot_filesystem()
    fs.write_text("after", "/work/state.txt")
    fs.remove("/work/data", recursive=True)
    restored = session.create(image=image, tags={"pool": "p1"})
    assert restored.filesystem.read_text("/work/state.txt") == "before"
    assert restored.filesystem.read_bytes("/work/data/blob.bin") == blob
    by_id = session.create(image=modal.Image.from_id(image.object_id, client=session.client), tags={"pool": "p2"})
    assert run(by_id, "cat", "/work/state.txt") == "before"
    assert sb.filesystem.read_text("/work/state.txt") == "after"
    snap = session.standin.images()[image.object_id]
    assert (snap.kind, snap.sandbox_id) == ("filesystem-snapshot", sb.object_id)

    assert session.listed({"pool": "p1"}) == {sb.object_id, restored.object_id}
    assert session.listed({"pool": "p2"}) == {by_id.object_id}
    record = session.standin.sandboxes()[sb.object_id]
    assert (record.api, record.tags, record.env, record.workdir, record.timeout_s) == (
        "v2",
        {"pool": "p1"},
        {"GLOBAL": "g"},
        "/work",
        60,
    )
    assert (record.cpu, record.memory_mb, record.network, record.gpu) == (1.5, 512, "blocked", None)
    for each in (sb, restored, by_id):
        each.terminate()
    assert session.listed() == set()
    assert {(r.state, r.ended_by) for r in session.standin.sandboxes().values()} == {("finished", "terminate")}
    with pytest.raises(SandboxTerminatedError):
        sb.wait()


def test_commands_and_files_stay_inside_a_local_sandbox(session: Session) -> None:
    sb = session.create()
    marker = f"/etc/modal-standin-{secrets.token_hex(4)}"
    assert run(sb, "bash", "-c", f"hostname; touch {marker}; id -u") == "sandbox\n0\n"
    sb.filesystem.write_text("x", f"{marker}-file")
    assert run(sb, "ls", marker, f"{marker}-file") == f"{marker}\n{marker}-file\n"
    assert not os.path.exists(marker) and not os.path.exists(f"{marker}-file")
    first = session.standin.commands[0]
    assert (first.sandbox_id, first.argv, first.workdir) == (
        sb.object_id,
        ("bash", "-c", f"hostname; touch {marker}; id -u"),
        "/root",
    )


def test_an_exec_timeout_gives_minus_one_and_the_sandbox_lives_on(session: Session) -> None:
    sb = session.create()
    p = sb.exec("bash", "-c", "echo started; sleep 10", timeout=1)
    assert p.wait() == -1
    assert p.stdout.read() == ""  # output is sent when a command ends, after the client's deadline
    wait_for(lambda: any(c.timed_out for c in session.standin.commands))  # killed in the sandbox too
    assert run(sb, "echo", "alive") == "alive\n"
    reader = sb.exec("cat")  # stdin stays open until EOF, as on Modal
    assert reader.poll() is None
    reader.stdin.write_eof()
    reader.stdin.drain()
    assert reader.wait() == 0
    exited = sb.exec("true")
    assert exited.wait() == 0
    exited.stdin.write(b"late")  # an exited command's stdin is closed
    with pytest.raises(ConflictError):
        exited.stdin.drain()


def test_a_wrong_token_secret_is_an_auth_error_and_the_log_masks_secrets(modal_standin: ModalStandin) -> None:
    wrong = modal_standin.client(token_secret="as-wrong")
    with pytest.raises(AuthError):
        modal.App.lookup("snapgym-tests", create_if_missing=True, client=wrong)
    assert [(r.rpc, r.status) for r in modal_standin.requests] == [("AppGetOrCreate", "UNAUTHENTICATED")]
    session = Session(modal_standin)
    run(session.create(), "true")
    requests = modal_standin.requests
    assert not any(modal_standin.token_secret in value for r in requests for value in r.metadata.values())
    control = [r for r in requests if r.server == "control" and r.status == "OK"]
    assert all(r.metadata["x-modal-token-secret"] == TOKEN_SECRET_MARKER for r in control)
    assert [r.metadata["x-modal-auth-token"] for r in control if r.rpc == "SandboxCreateV2"] == [JWT_MARKER]
    router = [r for r in requests if r.server == "router"]
    assert router and all(r.metadata["authorization"] == f"Bearer {JWT_MARKER}" for r in router)


def test_a_gpu_sandbox_goes_through_v1_with_its_gpu_recorded(session: Session) -> None:
    sb = session.create(gpu="A10G", env={"ONE": "1"}, tags={"kind": "gpu"}, cpu=2.0, memory=1024)
    assert run(sb, "bash", "-c", "echo $ONE") == "1\n"
    sb.filesystem.write_text("gpu", "/root/g.txt")
    restored = session.create(image=sb.snapshot_filesystem(), gpu="H100:2")
    assert restored.filesystem.read_text("/root/g.txt") == "gpu"
    assert session.listed({"kind": "gpu"}) == {sb.object_id}
    records = session.standin.sandboxes()
    assert (records[sb.object_id].api, records[sb.object_id].gpu, records[sb.object_id].cpu) == ("v1", "A10G", 2.0)
    assert (records[restored.object_id].api, records[restored.object_id].gpu) == ("v1", "H100:2")
    create = next(r for r in session.standin.requests if r.rpc == "SandboxCreate")
    assert create.fields["definition"]["resources"]["gpu_config"] == {"count": 1, "gpu_type": "A10G"}
    rpcs = {r.rpc for r in session.standin.requests}
    assert {"SecretGetOrCreate", "SandboxGetTaskId", "TaskGetCommandRouterAccess"} <= rpcs
    assert "SandboxCreateV2" not in rpcs
    sb.terminate()
    assert session.rpcs("SandboxTerminate") == ["OK"]
    assert session.listed({"kind": "gpu"}) == set()


def test_resource_exhausted_raises_unless_the_server_says_when_to_retry(session: Session) -> None:
    session.standin.fail_next("SandboxCreateV2", "RESOURCE_EXHAUSTED")
    with pytest.raises(ResourceExhaustedError):
        session.create()
    assert session.rpcs("SandboxCreateV2") == ["RESOURCE_EXHAUSTED"]  # not retried

    session.standin.fail_next("SandboxCreateV2", "RESOURCE_EXHAUSTED", count=2, retry_after_s=0.1)
    session.create()  # Modal's RPCRetryPolicy: the SDK sleeps and retries
    session.standin.fail_next("SandboxCreateV2", "UNAVAILABLE")
    session.create()  # transient: retried
    session.standin.fail_next("SandboxCreateV2", "UNAVAILABLE", count=10)
    with pytest.raises(ServiceError):
        session.create()  # the first try and 3 retries
    session.standin.clear_faults()
    assert (
        session.rpcs("SandboxCreateV2")[1:]
        == ["RESOURCE_EXHAUSTED"] * 2 + ["OK", "UNAVAILABLE", "OK"] + ["UNAVAILABLE"] * 4
    )
    assert session.standin.created_count == 2

    sb = session.create()
    session.standin.fail_next("TaskExecStart", "UNAVAILABLE", count=2)
    assert run(sb, "echo", "ok") == "ok\n"  # the router client retries too
    assert session.rpcs("TaskExecStart") == ["UNAVAILABLE", "UNAVAILABLE", "OK"]


def test_creates_past_the_rate_limit_are_resource_exhausted(session: Session) -> None:
    session.standin.max_creates_per_s = 1
    session.create()
    with pytest.raises(ResourceExhaustedError):
        session.create()
    assert session.standin.created_count == 1


def test_the_lifetime_ends_a_sandbox_whose_client_was_sigkilled(session: Session) -> None:
    kept = session.create(timeout=60)
    client = (
        "import sys, time, modal\n"
        "app = modal.App.lookup('snapgym-tests', create_if_missing=True)\n"
        "sb = modal.Sandbox.create(app=app, image=modal.Image.from_id(sys.argv[1]), timeout=3)\n"
        "sb.exec('sleep', '60')\n"
        "print(sb.object_id, flush=True)\n"
        "time.sleep(60)\n"
    )
    env = {**os.environ, **session.standin.sdk_env}
    argv = [sys.executable, "-c", client, session.standin.base_image_id]
    with subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, text=True) as proc:
        assert proc.stdout is not None
        orphan = proc.stdout.readline().strip()
        proc.send_signal(signal.SIGKILL)
    assert session.standin.sandboxes()[orphan].state == "running"
    wait_for(lambda: session.standin.sandboxes()[orphan].state == "finished")
    assert session.standin.sandboxes()[orphan].ended_by == "timeout"
    with pytest.raises(SandboxTimeoutError):
        modal.Sandbox.from_id(orphan, client=session.client).wait()
    assert session.listed() == {kept.object_id}


def test_reattach_by_id_and_name_tags_and_a_terminated_sandbox(session: Session) -> None:
    sb = session.create(name="worker-1", tags={"a": "1"})
    same = modal.Sandbox.from_id(sb.object_id, client=session.client)
    assert run(same, "echo", "hi") == "hi\n"
    assert same.get_tags() == {"a": "1"}
    same.set_tags({"b": "2"})  # replaces the whole set
    assert sb.get_tags() == {"b": "2"}
    assert (session.listed({"a": "1"}), session.listed({"b": "2"})) == (set(), {sb.object_id})
    assert modal.Sandbox.from_name("snapgym-tests", "worker-1", client=session.client).object_id == sb.object_id
    with pytest.raises(AlreadyExistsError):
        session.create(name="worker-1")

    sb.terminate()
    assert sb.poll() == 137
    with pytest.raises(NotFoundError):
        sb.exec("true")
    with pytest.raises(NotFoundError):
        modal.Sandbox.from_id(sb.object_id, client=session.client).exec("true")
    with pytest.raises(NotFoundError):
        sb.filesystem.read_text("/etc/hostname")


def test_filesystem_errors_are_the_sdks_exceptions(session: Session) -> None:
    sb = session.create()
    fs = sb.filesystem  # holds the sandbox weakly
    fs.write_text("x", "/tmp/file")
    fs.make_directory("/tmp/dir/sub")
    failing: list[tuple[Callable[[], object], type[Exception]]] = [
        (lambda: fs.read_bytes("/tmp/missing"), SandboxFilesystemNotFoundError),
        (lambda: fs.read_bytes("/tmp/dir"), SandboxFilesystemIsADirectoryError),
        (lambda: fs.list_files("/tmp/file"), SandboxFilesystemNotADirectoryError),
        (lambda: fs.write_text("y", "/tmp/file/under"), SandboxFilesystemNotADirectoryError),
        (lambda: fs.write_text("y", "/tmp/dir"), SandboxFilesystemIsADirectoryError),
        (lambda: fs.make_directory("/tmp/dir/sub", create_parents=False), SandboxFilesystemPathAlreadyExistsError),
        (lambda: fs.make_directory("/tmp/none/sub", create_parents=False), SandboxFilesystemNotFoundError),
        (lambda: fs.remove("/tmp/dir"), SandboxFilesystemDirectoryNotEmptyError),
        (lambda: fs.stat("/tmp/missing"), SandboxFilesystemNotFoundError),
    ]
    for call, error in failing:
        with pytest.raises(error):
            call()
    fs.make_directory("/tmp/dir/sub")  # create_parents=True: idempotent
    fs.remove("/tmp/dir", recursive=True)
    with pytest.raises(SandboxFilesystemNotFoundError):
        fs.remove("/tmp/dir")


def test_an_entrypoint_ends_its_sandbox_with_its_exit_code(session: Session) -> None:
    sb = session.create("bash", "-c", "sleep 0.3; exit 7")
    sb.wait()
    assert sb.returncode == 7
    assert session.standin.sandboxes()[sb.object_id].ended_by == "exit"
    server = session.create("sleep", "infinity")
    assert run(server, "echo", "up") == "up\n"


def test_what_the_stand_in_does_not_serve_is_unimplemented_and_logged(session: Session) -> None:
    with pytest.raises(UnimplementedError, match="builds only registry images"):
        modal.Sandbox.create(app=session.app, client=session.client)  # image=None builds debian_slim
    assert session.rpcs("ImageGetOrCreate") == ["UNIMPLEMENTED"]
    with pytest.raises(UnimplementedError):
        session.create().tunnels(timeout=1)
    assert session.rpcs("SandboxGetTunnelsV2") == ["UNIMPLEMENTED"]


def test_many_clients_at_once(session: Session) -> None:
    def episode(n: int) -> str:
        sb = session.create(tags={"n": str(n)})
        sb.filesystem.write_text(str(n), "/root/n.txt")
        out = run(sb, "cat", "/root/n.txt")
        sb.terminate()
        return out

    with ThreadPoolExecutor(max_workers=8) as workers:
        assert list(workers.map(episode, range(8))) == [str(n) for n in range(8)]
    assert session.listed() == set() and session.standin.created_count == 8
