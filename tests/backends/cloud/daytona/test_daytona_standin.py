"""The Daytona stand-in (tests/backends/cloud/daytona/standin.py) answers the real, unmodified daytona SDK the way
Daytona does, over local sandboxes: what a Daytona backend's offline tests stand on."""

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

import httpx
import pytest

from tests.support.needs import import_or_skip

import_or_skip("daytona", "the daytona SDK (0.226) is not installed")

from daytona import (  # noqa: E402
    CreateSandboxFromSnapshotParams,
    Daytona,
    DaytonaAuthenticationError,
    DaytonaBadRequestError,
    DaytonaError,
    DaytonaFileNotFoundError,
    DaytonaNotFoundError,
    DaytonaProcessExecutionTimeoutError,
    DaytonaRateLimitError,
    DaytonaServiceUnavailableError,
    DaytonaTimeoutError,
    DaytonaUnprocessableEntityError,
    FileDownloadRequest,
    FileUpload,
    ListSandboxesQuery,
    SessionExecuteRequest,
)

from tests.backends.cloud.daytona.standin import API_KEY_MARKER, DEFAULT_SNAPSHOT, DaytonaStandin  # noqa: E402

pytest_plugins = ["tests.backends.cloud.daytona.standin"]


def wait_for(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def params(**fields: Any) -> CreateSandboxFromSnapshotParams:
    return CreateSandboxFromSnapshotParams(**fields)


def listed(client: Daytona, **labels: str) -> set[str]:
    return {s.id for s in client.list(ListSandboxesQuery(labels=labels or None))}


@pytest.fixture
def client(daytona_standin: DaytonaStandin) -> Daytona:
    return Daytona(daytona_standin.sdk_config())


def test_create_exec_snapshot_list_and_delete(daytona_standin: DaytonaStandin, client: Daytona) -> None:
    sbx = client.create(params(labels={"run": "r1"}, env_vars={"GLOBAL": "g"}, network_block_all=True))
    assert (sbx.state, sbx.snapshot, sbx.labels["run"], sbx.network_block_all) == (
        "started",
        DEFAULT_SNAPSHOT,
        "r1",
        True,
    )
    record = daytona_standin.sandboxes()[sbx.id]
    assert (record.env, record.network, record.labels["code-toolbox-language"]) == (
        {"GLOBAL": "g"},
        {"networkBlockAll": True},
        "python",  # the SDK adds it
    )
    creating = [r for r in daytona_standin.requests if r.path.startswith("/sandbox")]
    assert [(r.method, r.path) for r in creating] == [("POST", "/sandbox"), ("GET", f"/sandbox/{sbx.id}")]

    run = sbx.process.exec("echo $GLOBAL $ONE; pwd; echo oops >&2; exit 3", env={"ONE": "1"}, cwd="/tmp")
    assert (run.exit_code, run.result) == (3, "g 1\n/tmp\noops\n")  # stdout and stderr together
    assert sbx.process.exec("pwd; echo $HOME").result == "/home/daytona\n/home/daytona\n"
    assert sbx.process.exec("true", cwd="/nowhere").exit_code == -1
    with pytest.raises(DaytonaBadRequestError):
        sbx.process.exec("true", env={"NOT-A-NAME": "x"})

    sbx.fs.upload_file(b"before", "state.txt")
    sbx.create_snapshot("golden")
    sbx.fs.upload_file(b"after", "state.txt")
    assert client.snapshot.get("golden").state == "active"
    restored = client.create(params(snapshot="golden", labels={"run": "r1"}))
    assert restored.fs.download_file("state.txt") == b"before"
    assert restored.process.exec("cat state.txt").result == "before"
    other = client.create(params(labels={"run": "r2"}))

    assert listed(client, run="r1") == {sbx.id, restored.id}
    assert listed(client, run="r2") == {other.id}
    assert client.get(restored.id).snapshot == "golden"
    for each in (sbx, restored, other):
        client.delete(each)
    assert listed(client) == set()
    with pytest.raises(DaytonaNotFoundError):
        client.get(sbx.id)
    assert {r.state for r in daytona_standin.sandboxes().values()} == {"destroyed"}
    assert {r.ended_by for r in daytona_standin.sandboxes().values()} == {"api"}


def test_files(client: Daytona) -> None:
    sbx = client.create()
    data = bytes(range(256)) * 100 + b"\r\n--boundary-ish\r\n"
    sbx.fs.upload_files([FileUpload(b"v1", "notes/a.txt"), FileUpload(data, "/tmp/bin.dat")])
    assert sbx.fs.download_file("/home/daytona/notes/a.txt") == b"v1"
    assert sbx.fs.download_file("/tmp/bin.dat") == data
    assert [(f.name, f.is_dir, f.size) for f in sbx.fs.list_files("notes")] == [("a.txt", False, 2)]
    info = sbx.fs.get_file_info("notes/a.txt")
    assert (info.size, info.mode, info.permissions, info.owner) == (2, "-rw-r--r--", "0644", "0")

    sbx.fs.create_folder("made/deep", "700")
    assert sbx.fs.get_file_info("made/deep").permissions == "0700"
    with pytest.raises(DaytonaBadRequestError):
        sbx.fs.delete_file("made")  # a folder needs recursive=True
    sbx.fs.delete_file("made", recursive=True)
    sbx.fs.delete_file("notes/a.txt")
    for missing in (lambda: sbx.fs.get_file_info("made"), lambda: sbx.fs.download_file("notes/a.txt")):
        with pytest.raises(DaytonaFileNotFoundError):
            missing()
    results = sbx.fs.download_files([FileDownloadRequest("/tmp/bin.dat"), FileDownloadRequest("nope")])
    assert results[0].result == data and results[1].error == "file not found: nope"
    assert results[1].error_details is not None and results[1].error_details.code == "FILE_NOT_FOUND"
    sbx.fs.upload_file(b"a\r\n--DAYTONA-FILE-BOUNDARY\r\nb", "clash.txt")
    with pytest.raises(DaytonaError):  # the daemon's multipart boundary is fixed: such a file cannot come back
        sbx.fs.download_file("clash.txt")


def test_commands_and_files_stay_inside_a_local_sandbox(daytona_standin: DaytonaStandin, client: Daytona) -> None:
    sbx = client.create()
    marker = f"/etc/daytona-standin-{secrets.token_hex(4)}"
    assert sbx.process.exec(f"hostname; touch {marker}; id -u").result == "sandbox\n0\n"
    sbx.fs.upload_file(b"x", f"{marker}-file")
    assert sbx.fs.get_file_info(marker).size == 0
    assert not os.path.exists(marker) and not os.path.exists(f"{marker}-file")
    assert daytona_standin.commands[0].command == f"hostname; touch {marker}; id -u"


def test_an_exec_timeout_raises_and_the_sandbox_lives_on(daytona_standin: DaytonaStandin, client: Daytona) -> None:
    sbx = client.create()
    with pytest.raises(DaytonaProcessExecutionTimeoutError) as timed_out:
        sbx.process.exec("echo lost; sleep 5", timeout=1)
    assert isinstance(timed_out.value, DaytonaTimeoutError) and timed_out.value.status_code == 408
    assert daytona_standin.commands[-1].timed_out
    assert sbx.process.exec("echo alive").result == "alive\n"


def test_sessions_split_the_streams_and_keep_cwd_and_exports(client: Daytona) -> None:
    sbx = client.create()
    sbx.process.create_session("s")
    first = sbx.process.execute_session_command(
        "s", SessionExecuteRequest(command="cd /tmp; export A=1; echo out; echo err >&2; false")
    )
    assert (first.stdout, first.stderr, first.exit_code) == ("out\n", "err\n", 1)
    second = sbx.process.execute_session_command("s", SessionExecuteRequest(command="pwd; echo $A"))
    assert (second.stdout, second.exit_code) == ("/tmp\n1\n", 0)

    started = sbx.process.execute_session_command(
        "s", SessionExecuteRequest(command="sleep 0.2; echo later", run_async=True)
    )
    assert started.exit_code is None
    wait_for(lambda: sbx.process.get_session_command("s", started.cmd_id).exit_code == 0)
    logs = sbx.process.get_session_command_logs("s", started.cmd_id)
    assert (logs.stdout, logs.stderr) == ("later\n", "")
    assert len(sbx.process.get_session("s").commands) == 3
    sbx.process.delete_session("s")
    with pytest.raises(DaytonaNotFoundError):
        sbx.process.execute_session_command("s", SessionExecuteRequest(command="true"))


def test_a_wrong_key_is_refused_and_the_logs_hide_the_key(daytona_standin: DaytonaStandin, client: Daytona) -> None:
    wrong = Daytona(daytona_standin.sdk_config(api_key="dtn_wrong"))
    with pytest.raises(DaytonaAuthenticationError):
        wrong.create()
    with pytest.raises(DaytonaAuthenticationError):
        list(wrong.list())
    sbx = client.create()
    sbx.process.exec("true")
    with httpx.Client(base_url=daytona_standin.url) as plain:  # the toolbox wants the key too
        assert plain.post(f"/toolbox/{sbx.id}/process/execute", json={"command": "true"}).status_code == 401
    answered = [r for r in daytona_standin.requests if r.status != 401 and "socket.io" not in r.path]
    assert answered and all(r.headers["authorization"] == f"Bearer {API_KEY_MARKER}" for r in answered)
    assert any(r.is_toolbox and r.sandbox_id == sbx.id for r in answered)


def test_rate_limits_surface_without_retries(daytona_standin: DaytonaStandin, client: Daytona) -> None:
    daytona_standin.fail_next("POST", "/sandbox", 429, retry_after=0)
    with pytest.raises(DaytonaRateLimitError) as limited:
        client.create()
    assert limited.value.headers["Retry-After"] == "0"
    assert [r.status for r in daytona_standin.requests if r.path == "/sandbox"] == [429]  # no retry

    daytona_standin.max_creates_per_s = 1
    client.create()
    with pytest.raises(DaytonaRateLimitError):
        client.create()
    assert daytona_standin.created_count == 1


def test_a_lost_create_answer_leaves_a_sandbox_to_find_by_label(
    daytona_standin: DaytonaStandin, client: Daytona
) -> None:
    daytona_standin.fail_next("POST", "/sandbox", 503, after=True)
    with pytest.raises(DaytonaServiceUnavailableError):
        client.create(params(labels={"attempt": "a1"}))
    assert len(listed(client, attempt="a1")) == 1 and daytona_standin.created_count == 1


def test_lifetimes_end_sandboxes_whose_client_was_sigkilled(daytona_standin: DaytonaStandin, client: Daytona) -> None:
    daytona_standin.minute_s = 0.2
    client_code = (
        "import time\nfrom daytona import Daytona, CreateSandboxFromSnapshotParams as P\n"
        "s = Daytona().create(P(ephemeral=True, auto_stop_interval=3))\nprint(s.id, flush=True)\ntime.sleep(60)\n"
    )
    env = {**os.environ, **daytona_standin.sdk_env}
    records = daytona_standin.sandboxes
    with subprocess.Popen([sys.executable, "-c", client_code], env=env, stdout=subprocess.PIPE, text=True) as proc:
        kept = client.create(params(auto_stop_interval=0))  # while the client imports the SDK
        ttl = client.create(params(auto_stop_interval=0, ttl_minutes=2))
        idle = client.create(params(auto_stop_interval=2, auto_delete_interval=3))
        # a TTL sets a deletion time at once (under load the 0.4 s TTL may already have ended it)
        assert records()[ttl.id].delete_at is not None or records()[ttl.id].ended_by == "ttl"
        assert records()[kept.id].delete_at is None
        wait_for(lambda: records()[idle.id].state == "stopped")
        assert proc.stdout is not None
        orphan = proc.stdout.readline().strip()
        proc.send_signal(signal.SIGKILL)
    wait_for(lambda: records()[orphan].state == "destroyed")
    assert records()[orphan].ended_by == "auto-delete" and records()[orphan].auto_delete_interval == 0
    wait_for(lambda: records()[idle.id].state == "destroyed")
    assert (records()[ttl.id].ended_by, records()[idle.id].ended_by) == ("ttl", "auto-delete")
    assert listed(client) == {kept.id}
    with pytest.raises(DaytonaNotFoundError):
        client.get(orphan)


def test_stop_start_and_polling_through_transitional_states(daytona_standin: DaytonaStandin) -> None:
    daytona_standin.settle_polls = 2
    with pytest.warns(DeprecationWarning):
        polling = Daytona(daytona_standin.sdk_config(use_deprecated_polling=True))
    sbx = polling.create()
    sbx.process.exec("echo kept > f; sleep 60 &")
    sbx.stop()
    assert (sbx.state, daytona_standin.sandboxes()[sbx.id].state) == ("stopped", "stopped")
    with pytest.raises(DaytonaBadRequestError):
        sbx.process.exec("true")  # no toolbox while stopped
    sbx.archive()
    assert daytona_standin.sandboxes()[sbx.id].state == "archived"
    sbx.start()
    assert sbx.state == "started"
    assert sbx.process.exec("cat f; pgrep sleep || echo gone").result == "kept\ngone\n"
    gets = [r for r in daytona_standin.requests if r.method == "GET" and r.path == f"/sandbox/{sbx.id}"]
    assert len(gets) >= 9  # create, stop and start each polled through two transitional answers


def test_fork_gives_independent_copies_on_vm_classes(daytona_standin: DaytonaStandin, client: Daytona) -> None:
    container = client.create()
    with pytest.raises(DaytonaUnprocessableEntityError):
        container.fork()
    daytona_standin.sandbox_class = "linux-vm"
    source = client.create(params(labels={"pool": "p"}))
    source.fs.upload_file(b"forked", "state.txt")
    fork = source.fork(name="child")
    assert (fork.name, fork.labels["pool"], fork.fs.download_file("state.txt")) == ("child", "p", b"forked")
    fork.fs.upload_file(b"changed", "state.txt")
    assert source.fs.download_file("state.txt") == b"forked"
    assert daytona_standin.sandboxes()[fork.id].forked_from == source.id
    with pytest.raises(DaytonaBadRequestError):
        client.delete(source)  # its fork lives
    client.delete(fork)
    client.delete(source)


def test_snapshot_names_listing_and_deletion(daytona_standin: DaytonaStandin, client: Daytona) -> None:
    with pytest.raises(DaytonaBadRequestError, match="Snapshot nope not found"):
        client.create(params(snapshot="nope"))  # a 400 in Daytona, not a 404
    sbx = client.create()
    sbx.fs.upload_file(b"one", "v.txt")
    sbx.create_snapshot("team/env:1")
    sbx.fs.upload_file(b"two", "v.txt")
    sbx.create_snapshot("team/env:1")  # a taken name: Daytona drops the new one without an error
    assert client.create(params(snapshot="team/env:1")).fs.download_file("v.txt") == b"one"
    with pytest.raises(DaytonaBadRequestError):
        sbx.create_snapshot("see https://example.com")
    page = client.snapshot.list()
    assert [s.name for s in page.items] == ["team/env:1", DEFAULT_SNAPSHOT] and page.total == 2
    assert client.snapshot.list(source_sandbox_id=sbx.id).total == 1
    client.snapshot.delete("team/env:1")
    with pytest.raises(DaytonaNotFoundError):
        client.snapshot.get("team/env:1")
    assert set(daytona_standin.snapshots()) == {DEFAULT_SNAPSHOT}


def test_listing_pages_with_the_cursor(daytona_standin: DaytonaStandin, client: Daytona) -> None:
    ids = {client.create(params(labels={"page": "x"})).id for _ in range(3)}
    client.create()
    assert {s.id for s in client.list(ListSandboxesQuery(labels={"page": "x"}, limit=2))} == ids
    pages = [r for r in daytona_standin.requests if r.method == "GET" and r.path == "/sandbox"]
    assert [("cursor" in r.query, r.query["limit"]) for r in pages] == [(False, "2"), (True, "2")]


def test_many_clients_at_once(daytona_standin: DaytonaStandin) -> None:
    def episode(n: int) -> str:
        client = Daytona(daytona_standin.sdk_config())
        sbx = client.create(params(labels={"n": str(n)}))
        sbx.fs.upload_file(str(n).encode(), "n.txt")
        out = sbx.process.exec("cat n.txt").result
        client.delete(sbx)
        return out

    with ThreadPoolExecutor(max_workers=6) as workers:
        assert list(workers.map(episode, range(6))) == [str(n) for n in range(6)]
    assert daytona_standin.created_count == 6
    assert {r.state for r in daytona_standin.sandboxes().values()} == {"destroyed"}
