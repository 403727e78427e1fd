"""The E2B stand-in (tests/backends/cloud/e2b/standin.py) answers the real, unmodified e2b SDK the way E2B does,
over local sandboxes: what an E2B backend's offline tests stand on."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from e2b import (
    ApiParams,
    AuthenticationException,
    CommandExitException,
    FileNotFoundException,
    RateLimitException,
    Sandbox,
    SandboxException,
    SandboxNotFoundException,
    SandboxNotRunningException,
    SandboxQuery,
    SandboxState,
    ServiceBusyException,
    TimeoutException,
)

from tests.backends.cloud.e2b.standin import API_KEY_MARKER, E2BStandin

pytest_plugins = ["tests.backends.cloud.e2b.standin"]


def wait_for(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def listed(standin: E2BStandin, query: SandboxQuery | None = None) -> set[str]:
    paginator = Sandbox.list(query=query, **standin.sdk_options)
    found: set[str] = set()
    while paginator.has_next:
        found.update(info.sandbox_id for info in paginator.next_items())
    return found


def test_commands_files_snapshots_listing_and_kill(e2b_standin: E2BStandin) -> None:
    opts = e2b_standin.sdk_options
    sbx = Sandbox.create(metadata={"run": "r1"}, envs={"GLOBAL": "g"}, **opts)

    result = sbx.commands.run("echo $GLOBAL $ONE; pwd; echo oops >&2", envs={"ONE": "1"})
    assert (result.stdout, result.stderr, result.exit_code) == ("g 1\n/home/user\n", "oops\n", 0)
    assert sbx.commands.run("pwd", cwd="/tmp").stdout == "/tmp\n"
    assert sbx.commands.run("echo $HOME", user="root").stdout == "/root\n"
    with pytest.raises(CommandExitException) as failed:
        sbx.commands.run("echo partial; echo bad >&2; exit 3")
    assert (failed.value.exit_code, failed.value.stdout, failed.value.stderr) == (3, "partial\n", "bad\n")

    info = sbx.files.write("notes/a.txt", "v1")
    assert (info.path, info.name) == ("/home/user/notes/a.txt", "a.txt")
    assert sbx.files.read("/home/user/notes/a.txt") == "v1"
    assert sbx.commands.run("cat notes/a.txt").stdout == "v1"
    assert [(e.name, e.type.value if e.type else None) for e in sbx.files.list("notes")] == [("a.txt", "file")]
    assert sbx.files.exists("notes") and not sbx.files.exists("nothing")
    assert sbx.files.get_info("notes/a.txt").size == 2
    assert sbx.files.make_dir("made/deep") and not sbx.files.make_dir("made/deep")
    assert sbx.files.rename("notes/a.txt", "made/b.txt").path == "/home/user/made/b.txt"
    sbx.files.remove("made")
    assert not sbx.files.exists("made/b.txt")
    with pytest.raises(FileNotFoundException):
        sbx.files.read("made/b.txt")
    with pytest.raises(FileNotFoundException):
        sbx.files.list("made")

    sbx.files.write("state.txt", "before")
    snap = sbx.create_snapshot()
    sbx.files.write("state.txt", "after")
    restored = Sandbox.create(template=snap.snapshot_id, metadata={"run": "r1"}, **opts)
    assert restored.files.read("state.txt") == "before"
    assert snap.snapshot_id in e2b_standin.snapshots()
    other = Sandbox.create(metadata={"run": "r2"}, **opts)

    assert listed(e2b_standin, SandboxQuery(metadata={"run": "r1"})) == {sbx.sandbox_id, restored.sandbox_id}
    assert listed(e2b_standin, SandboxQuery(metadata={"run": "r2"})) == {other.sandbox_id}
    assert sbx.get_info().metadata == {"run": "r1"}
    for each in (sbx, restored, other):
        assert each.kill()
    assert listed(e2b_standin) == set()
    assert not Sandbox.kill(sbx.sandbox_id, **opts)
    assert {r.state for r in e2b_standin.sandboxes().values()} == {"killed"}


def test_commands_and_files_stay_inside_a_local_sandbox(e2b_standin: E2BStandin) -> None:
    sbx = Sandbox.create(**e2b_standin.sdk_options)
    marker = f"/etc/e2b-standin-{secrets.token_hex(4)}"
    assert sbx.commands.run(f"hostname; touch {marker}; id -u").stdout == "sandbox\n0\n"
    sbx.files.write(f"{marker}-file", b"x")
    assert sbx.files.exists(marker)
    assert not os.path.exists(marker) and not os.path.exists(f"{marker}-file")
    assert e2b_standin.commands[0].command == f"/bin/bash -l -c 'hostname; touch {marker}; id -u'"


def test_binary_files_by_every_upload_path(e2b_standin: E2BStandin) -> None:
    sbx = Sandbox.create(**e2b_standin.sdk_options)
    data = bytes(range(256)) * 300 + b"\r\n--boundary-ish\r\n"
    sbx.files.write("multipart.bin", data)
    sbx.files.write("octet.bin", data, use_octet_stream=True)
    sbx.files.write("gzip.bin", data, gzip=True)
    sbx.files.write_files([{"path": "many/1.txt", "data": "one"}, {"path": "/tmp/2.txt", "data": b"two"}])
    for name in ("multipart.bin", "octet.bin", "gzip.bin"):
        assert sbx.files.read(name, format="bytes") == data
    assert (sbx.files.read("many/1.txt"), sbx.files.read("/tmp/2.txt")) == ("one", "two")
    uploads = [r for r in e2b_standin.requests if r.path == "/files" and r.method == "POST"]
    kinds = [r.headers["content-type"].split(";")[0] for r in uploads]
    assert kinds == ["multipart/form-data", *["application/octet-stream"] * 2, "multipart/form-data"]
    assert uploads[2].headers["content-encoding"] == "gzip"


def test_a_command_timeout_raises_and_the_sandbox_lives_on(e2b_standin: E2BStandin) -> None:
    sbx = Sandbox.create(**e2b_standin.sdk_options)
    with pytest.raises(TimeoutException):
        sbx.commands.run("sleep 5", timeout=0.5)
    wait_for(lambda: any(c.timed_out for c in e2b_standin.commands))  # killed in the sandbox too
    assert sbx.commands.run("echo alive").stdout == "alive\n"


def test_a_wrong_key_is_refused_and_no_key_reaches_a_sandbox(e2b_standin: E2BStandin) -> None:
    wrong: ApiParams = {**e2b_standin.sdk_options, "api_key": "e2b_wrong"}
    with pytest.raises(AuthenticationException):
        Sandbox.create(**wrong)
    with pytest.raises(AuthenticationException):
        Sandbox.list(**wrong).next_items()
    sbx = Sandbox.create(**e2b_standin.sdk_options)
    sbx.commands.run("true")
    sbx.files.write("a", "b")
    envd = [r for r in e2b_standin.requests if r.is_envd]
    assert envd and all(r.sandbox_id == sbx.sandbox_id and r.headers.get("x-access-token") for r in envd)
    assert not any(API_KEY_MARKER in value for r in envd for value in r.headers.values())
    control = [r for r in e2b_standin.requests if not r.is_envd and r.status != 401]
    assert all(r.headers["x-api-key"] == API_KEY_MARKER for r in control)
    with httpx.Client(base_url=e2b_standin.url, headers={"E2b-Sandbox-Id": sbx.sandbox_id}) as envd_api:
        assert envd_api.get("/health").status_code == 401  # envd wants the sandbox's access token
        assert envd_api.get("/health", headers={"X-Access-Token": "guess"}).status_code == 401


def test_retry_after_zero_is_retried_and_rate_limits_surface(e2b_standin: E2BStandin) -> None:
    opts = e2b_standin.sdk_options
    e2b_standin.fail_next("POST", "/v2/sandboxes", 429, count=2, retry_after=0)
    Sandbox.create(**opts)
    assert [r.status for r in e2b_standin.requests if r.path == "/v2/sandboxes"] == [429, 429, 201]

    e2b_standin.fail_next("POST", "/v2/sandboxes", 429, count=10, retry_after=0)
    with pytest.raises(RateLimitException):  # the first try and 3 retries
        Sandbox.create(**opts)
    e2b_standin.clear_faults()
    e2b_standin.fail_next("*", "/v2/sandboxes", 503, count=10, should_retry=False)
    with pytest.raises(ServiceBusyException):
        Sandbox.create(**opts)
    assert [r.status for r in e2b_standin.requests if r.path == "/v2/sandboxes"][3:] == [429] * 4 + [503]
    assert e2b_standin.created_count == 1


def test_creates_and_forks_past_the_rate_limit_get_429(e2b_standin: E2BStandin) -> None:
    e2b_standin.max_creates_per_s, e2b_standin.rate_limit_retry_after_s = 2, 0
    source = Sandbox.create(**e2b_standin.sdk_options)
    forks = source.fork(count=3)
    assert [type(f).__name__ for f in forks] == ["Sandbox", "RateLimitException", "RateLimitException"]
    with pytest.raises(RateLimitException):
        Sandbox.create(**e2b_standin.sdk_options)
    assert e2b_standin.created_count == 2


def test_an_idempotency_key_gives_one_sandbox_even_when_the_answer_is_lost(e2b_standin: E2BStandin) -> None:
    opts = e2b_standin.sdk_options
    first = Sandbox.create(idempotency_key="episode-1", **opts)
    again = Sandbox.create(idempotency_key="episode-1", **opts)
    assert first.sandbox_id == again.sandbox_id and e2b_standin.created_count == 1

    e2b_standin.fail_next("POST", "/v2/sandboxes", 503, retry_after=0, after=True)
    lost = Sandbox.create(idempotency_key="episode-2", **opts)
    creates = [r for r in e2b_standin.requests if r.path == "/v2/sandboxes"][2:]
    assert [(r.status, r.headers["idempotency-key"]) for r in creates] == [(503, "episode-2"), (201, "episode-2")]
    assert e2b_standin.created_count == 2 and lost.commands.run("echo ok").stdout == "ok\n"


def test_the_lifetime_kills_a_sandbox_whose_client_was_sigkilled(e2b_standin: E2BStandin) -> None:
    opts = e2b_standin.sdk_options
    kept = Sandbox.create(timeout=1, **opts)
    kept.set_timeout(60)
    client = (
        "import sys, time\nfrom e2b import Sandbox\n"
        "s = Sandbox.create(timeout=2)\ns.commands.run('sleep 60', background=True)\n"
        "print(s.sandbox_id, flush=True)\ntime.sleep(60)\n"
    )
    env = {**os.environ, **e2b_standin.sdk_env}
    with subprocess.Popen([sys.executable, "-c", client], env=env, stdout=subprocess.PIPE, text=True) as proc:
        assert proc.stdout is not None
        orphan = proc.stdout.readline().strip()
        proc.send_signal(signal.SIGKILL)
    wait_for(lambda: e2b_standin.sandboxes()[orphan].state == "killed")
    assert e2b_standin.sandboxes()[orphan].ended_by == "timeout"
    assert e2b_standin.sandboxes()[kept.sandbox_id].state == "running"
    with pytest.raises(SandboxNotFoundException):
        Sandbox.get_info(orphan, **opts)
    with pytest.raises(SandboxNotFoundException):
        Sandbox.connect(orphan, **opts)
    assert listed(e2b_standin) == {kept.sandbox_id}


def test_a_killed_sandbox_answers_envd_calls_as_not_running(e2b_standin: E2BStandin) -> None:
    sbx = Sandbox.create(**e2b_standin.sdk_options)
    Sandbox.kill(sbx.sandbox_id, **e2b_standin.sdk_options)
    assert not sbx.is_running()
    with pytest.raises(SandboxNotRunningException):
        sbx.commands.run("true")


def test_fork_starts_independent_copies_of_the_current_state(e2b_standin: E2BStandin) -> None:
    source = Sandbox.create(metadata={"pool": "p"}, **e2b_standin.sdk_options)
    source.files.write("state.txt", "forked")
    forks = source.fork(count=2)
    assert all(isinstance(f, Sandbox) for f in forks)
    a, b = (f for f in forks if isinstance(f, Sandbox))
    assert a.files.read("state.txt") == b.files.read("state.txt") == "forked"
    a.files.write("state.txt", "changed")
    assert (b.files.read("state.txt"), source.files.read("state.txt")) == ("forked", "forked")
    assert listed(e2b_standin, SandboxQuery(metadata={"pool": "p"})) == {source.sandbox_id, a.sandbox_id, b.sandbox_id}


def test_named_snapshots_templates_and_unknown_ones(e2b_standin: E2BStandin) -> None:
    opts = e2b_standin.sdk_options
    sbx = Sandbox.create(**opts)
    sbx.files.write("golden.txt", "gold")
    snap = sbx.create_snapshot(name="golden")
    assert snap.names == ["golden"]
    assert Sandbox.create(template="golden", **opts).files.read("golden.txt") == "gold"
    assert [s.snapshot_id for s in Sandbox.list_snapshots(**opts).next_items()] == [snap.snapshot_id]
    assert Sandbox.delete_snapshot(snap.snapshot_id, **opts) and not Sandbox.delete_snapshot("golden", **opts)
    with pytest.raises(SandboxException) as unknown:
        Sandbox.create(template="golden", **opts)
    assert unknown.value.status_code == 404


def test_pause_and_connect_keep_the_files(e2b_standin: E2BStandin) -> None:
    opts = e2b_standin.sdk_options
    sbx = Sandbox.create(**opts)
    sbx.files.write("kept.txt", "yes")
    assert sbx.pause() and not sbx.pause()
    assert Sandbox.get_info(sbx.sandbox_id, **opts).state == SandboxState.PAUSED
    resumed = Sandbox.connect(sbx.sandbox_id, **opts)
    assert resumed.files.read("kept.txt") == "yes"


def test_listing_pages_with_the_next_token(e2b_standin: E2BStandin) -> None:
    ids = {Sandbox.create(**e2b_standin.sdk_options).sandbox_id for _ in range(3)}
    paginator = Sandbox.list(limit=2, **e2b_standin.sdk_options)
    pages = [paginator.next_items()]
    assert paginator.has_next
    pages.append(paginator.next_items())
    assert [len(p) for p in pages] == [2, 1] and not paginator.has_next
    assert {s.sandbox_id for page in pages for s in page} == ids


def test_many_clients_at_once(e2b_standin: E2BStandin) -> None:
    def episode(n: int) -> str:
        sbx = Sandbox.create(metadata={"n": str(n)}, **e2b_standin.sdk_options)
        sbx.files.write("n.txt", str(n))
        out = sbx.commands.run("cat n.txt").stdout
        sbx.kill()
        return out

    with ThreadPoolExecutor(max_workers=8) as workers:
        assert list(workers.map(episode, range(8))) == [str(n) for n in range(8)]
    assert listed(e2b_standin) == set() and e2b_standin.created_count == 8
