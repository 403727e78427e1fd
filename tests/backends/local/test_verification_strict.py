"""Strict verification on the local backend: the agent is gone, and only its outputs reach the verifier."""

from __future__ import annotations

import errno
from collections.abc import Iterator
from pathlib import Path

import pytest

from pool import ConfigError, FileOperationError, LocalBackend, LocalSandbox, SandboxError, Snapshot, Template
from pool.verification import VerificationPlan, VerifyMode

APP = Template(
    name="tests-verify-strict",
    setup=[
        "mkdir -p /app/sub /opt/tool && echo start > /app/given && echo pristine > /etc/marker",
        "echo 'print(\"tool\")' > /opt/tool/tool.py && mkdir -p /root/.local/bin",
    ],
    workdir="/app",
)


@pytest.fixture(scope="module")
def tests_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("strict-tests")
    (folder / "test.sh").write_text("#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n")
    (folder / "expected.txt").write_text("the answer the agent must not read\n")
    return folder


@pytest.fixture(scope="module")
def app(backend: LocalBackend) -> Snapshot:
    return backend.build(APP)


@pytest.fixture()
def sandbox(backend: LocalBackend, app: Snapshot) -> Iterator[LocalSandbox]:
    with backend.create(app) as sbx:
        yield sbx


def strict(tests: Path, known_good: Snapshot | None = None, outputs: tuple[str, ...] = ("/app",)) -> VerificationPlan:
    return VerificationPlan(VerifyMode.STRICT, tests, outputs=outputs, known_good=known_good)


def test_the_agent_is_gone_and_only_its_outputs_remain(sandbox: LocalSandbox, tests_dir: Path) -> None:
    """Processes, non-output files, loader and shell config of the agent's turn are not the verifier's."""
    sandbox.exec(
        "echo agent > /app/result && rm /app/given && echo hacked > /etc/marker && echo /x.so > /etc/ld.so.preload"
        " && echo 'export X=1' >> /root/.bashrc && echo evil > /root/.local/bin/python3 && chmod +x"
        " /root/.local/bin/python3 && (setsid sh -c 'while true; do sleep 1; done' >/dev/null 2>&1 &)"
        " && echo tmp > /tmp/left && rm /bin && ln -s /app /bin"
    )
    report = sandbox.begin_verification(strict(tests_dir))
    assert report.mode is VerifyMode.STRICT and report.removed_links == () and report.missing_outputs == ()
    probe = sandbox.exec(
        "ls /app; cat /etc/marker; test -e /etc/ld.so.preload && echo preload; test -e /tmp/left && echo tmp;"
        " grep -sc X= /root/.bashrc; test -e /root/.local/bin/python3 && echo shadow; readlink /bin;"
        " ps -eo args | grep -c '^sh -c while' "
    )
    lines = probe.stdout.split()
    assert lines == ["result", "sub", "pristine", "usr/bin", "0"], probe.stdout
    # the outputs as the agent left them (given deleted, result added); the known-good /etc, /root (no
    # .bashrc), /tmp and /bin; and no process of the agent


def test_tests_and_reward_directory_are_fresh_and_writable(sandbox: LocalSandbox, tests_dir: Path) -> None:
    sandbox.exec("mkdir -p /logs/verifier /tests && echo 1 > /logs/verifier/reward.txt && echo evil > /tests/test.sh")
    sandbox.begin_verification(strict(tests_dir))
    r = sandbox.exec("ls -A /logs/verifier; cat /tests/test.sh; echo x > /tests/scratch && echo writable")
    assert r.stdout == "#!/bin/bash\necho 1 > /logs/verifier/reward.txt\nwritable\n"
    sandbox.restore()
    sandbox.begin_verification(strict(tests_dir))
    assert sandbox.exec("ls /tests").stdout == "expected.txt\ntest.sh\n"  # the writes of the last run are gone


@pytest.mark.parametrize(
    "link",
    [
        "/tests/expected.txt",
        "../tests/expected.txt",
        "/proc/self/root/tests/expected.txt",
        "/proc/1/cwd/../tests/expected.txt",
        "/dev/fd/../../tests/expected.txt",
        "/logs/verifier/reward.txt",
        "/var/../tests",
    ],
)
def test_links_into_the_verifiers_private_paths_are_removed(sandbox: LocalSandbox, tests_dir: Path, link: str) -> None:
    """An output that points at the expected answer (or the reward) is removed and reported."""
    deep = link if link.startswith("/") else f"../../{link}"  # the same place, two levels down
    sandbox.exec(f"ln -s '{link}' /app/answer.txt && mkdir -p /app/deep/er && ln -s '{deep}' /app/deep/er/x")
    report = sandbox.begin_verification(strict(tests_dir))
    assert set(report.removed_links) == {f"/app/answer.txt -> {link}", f"/app/deep/er/x -> {deep}"}
    assert sandbox.exec("ls -A /app /app/deep/er").stdout == "/app:\ndeep\ngiven\nsub\n\n/app/deep/er:\n"


def test_chains_of_links_are_followed_and_harmless_links_kept(sandbox: LocalSandbox, tests_dir: Path) -> None:
    sandbox.exec(
        "ln -s /app/hop /app/answer.txt && ln -s /tests /app/hop"  # a chain: answer -> hop -> /tests
        " && ln -s given /app/fine && ln -s /etc/marker /app/marker && ln -s /nowhere /app/dangling"
    )
    report = sandbox.begin_verification(strict(tests_dir))
    assert set(report.removed_links) == {"/app/hop -> /tests", "/app/answer.txt -> /app/hop"}
    assert sandbox.exec("cat /app/fine /app/marker; readlink /app/dangling").stdout == "start\npristine\n/nowhere\n"


@pytest.mark.parametrize(
    "replace", ["rm -rf /app", "rm -rf /app && echo x > /app", "rm -rf /app && ln -s /tests /app", "rm -rf /app/*"]
)
def test_an_output_that_is_gone_or_not_a_directory_is_shown_empty(
    sandbox: LocalSandbox, tests_dir: Path, replace: str
) -> None:
    sandbox.exec(f"cd / && {replace}")
    report = sandbox.begin_verification(strict(tests_dir))
    assert sandbox.exec("ls -A /app", cwd="/").stdout == ""
    assert report.missing_outputs == (() if replace.endswith("*") else ("/app",))
    assert sandbox.exec("cat /tests/expected.txt", cwd="/").exit_code == 0  # /tests is not /app's target


def test_a_checkpoint_is_verified_against_the_known_good_snapshot(
    backend: LocalBackend, sandbox: LocalSandbox, app: Snapshot, tests_dir: Path
) -> None:
    """Tampering done before a checkpoint is the agent's too: only its outputs reach the verifier."""
    sandbox.exec("echo hacked > /etc/marker && echo before > /app/before")
    checkpoint = sandbox.snapshot()
    with backend.create(checkpoint) as child:
        child.exec("echo after > /app/after")
        report = child.begin_verification(strict(tests_dir, known_good=app))
        assert report.removed_links == ()
        assert child.exec("cat /etc/marker; ls /app").stdout == "pristine\nafter\nbefore\ngiven\nsub\n"
        child.restore()  # back at the checkpoint, the agent's state
        assert child.exec("cat /etc/marker").stdout == "hacked\n"


def test_a_plan_for_another_snapshot_is_refused(backend: LocalBackend, sandbox: LocalSandbox, tests_dir: Path) -> None:
    other = backend.build(Template(name="tests-verify-other", setup=["mkdir -p /app"], workdir="/app"))
    with pytest.raises(ConfigError, match=r"not \w+ or a checkpoint of it"):
        sandbox.begin_verification(strict(tests_dir, known_good=other))


def test_the_verifiers_leftovers_are_killed_before_the_reward_is_read(sandbox: LocalSandbox, tests_dir: Path) -> None:
    """A background writer started during verification is dead when the command returns."""
    sandbox.begin_verification(strict(tests_dir))
    sandbox.exec("echo 0 > /logs/verifier/reward.txt; (setsid sh -c 'sleep 0.3; echo 1 > /logs/verifier/reward.txt' &)")
    assert sandbox.exec("sleep 0.6; cat /logs/verifier/reward.txt").stdout == "0\n"


def test_reward_files_are_read_without_following_links(sandbox: LocalSandbox, tests_dir: Path) -> None:
    sandbox.begin_verification(strict(tests_dir))
    sandbox.exec("echo 1 > /app/one && ln -s /app/one /logs/verifier/reward.txt && mkfifo /logs/verifier/fifo")
    with pytest.raises(SandboxError, match="Too many levels of symbolic links"):
        sandbox.read_file("/logs/verifier/reward.txt", follow_symlinks=False)
    with pytest.raises(SandboxError, match="Invalid argument"):
        sandbox.read_file("/logs/verifier/fifo", follow_symlinks=False)
    assert sandbox.read_file("/logs/verifier/reward.txt") == b"1\n"  # following them is still the default


def test_sealing_twice_or_snapshotting_a_sealed_sandbox_is_refused(sandbox: LocalSandbox, tests_dir: Path) -> None:
    sandbox.begin_verification(strict(tests_dir))
    with pytest.raises(SandboxError, match="sealed"):
        sandbox.begin_verification(strict(tests_dir))
    with pytest.raises(SandboxError, match="restore"):
        sandbox.snapshot()
    sandbox.restore()
    assert sandbox.sealed is None and sandbox.exec("cat /app/given").stdout == "start\n"


def test_deep_trees_in_the_outputs_are_audited(sandbox: LocalSandbox, tests_dir: Path) -> None:
    """A link at the bottom of a tree deeper than PATH_MAX is still found."""
    make = (
        "import os\nos.chdir('/app')\nfor _ in range(1500):\n    os.mkdir('d'); os.chdir('d')\n"
        "os.symlink('/tests/expected.txt', 'x')\n"
    )
    sandbox.write_file("/tmp/deep.py", make)
    assert sandbox.exec("python3 /tmp/deep.py").ok
    report = sandbox.begin_verification(strict(tests_dir))
    assert len(report.removed_links) == 1 and report.removed_links[0].endswith("/d/x -> /tests/expected.txt")


def test_private_files_read_from_the_host_side_keep_file_semantics(sandbox: LocalSandbox, tests_dir: Path) -> None:
    """The strict verifier's reward files are read straight from its writable layer: same answers as inside."""
    sandbox.begin_verification(strict(tests_dir))
    sandbox.exec(
        "cd /logs/verifier && echo 0.5 > reward.txt && head -c 2000 /dev/zero > big && echo x > gone && rm gone"
        " && mkdir sub && ln -s /app sub/link && echo via-link > /app/file"
    )
    assert sandbox.read_file("/logs/verifier/reward.txt", max_bytes=100) == b"0.5\n"
    for path, max_bytes, err in [("gone", None, errno.ENOENT), ("big", 100, errno.EFBIG), ("sub", None, errno.EISDIR)]:
        with pytest.raises(FileOperationError) as caught:
            sandbox.read_file(f"/logs/verifier/{path}", max_bytes=max_bytes)
        assert caught.value.errno == err
    assert sandbox.read_file("/logs/verifier/sub/link/file") == b"via-link\n"  # a link: the sandbox resolves it


def test_a_tests_folder_edited_between_episodes_is_the_one_the_next_verifier_sees(
    backend: LocalBackend, app: Snapshot, tmp_path: Path
) -> None:
    """The stored tests layer is keyed by the folder's listing (names, sizes, times, modes, subfolders too):
    a file changed, added or removed under it, however deep, gives the next seal a new layer."""
    folder = tmp_path / "tests"
    (folder / "data" / "deep").mkdir(parents=True)
    (folder / "test.sh").write_text("#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n")
    (folder / "data" / "deep" / "case.txt").write_text("first\n")
    seen = []
    edits = [
        lambda: (folder / "data" / "deep" / "case.txt").write_text("second, longer\n"),
        lambda: (folder / "data" / "added.txt").write_text("new\n"),
        lambda: (folder / "data" / "added.txt").unlink(),
    ]
    for edit in [lambda: None, *edits]:
        edit()
        with backend.create(app) as sbx:
            sbx.begin_verification(strict(folder))
            seen.append(sbx.exec("cat /tests/data/deep/case.txt; ls /tests/data").stdout)
    assert seen == [
        "first\ndeep\n",
        "second, longer\ndeep\n",
        "second, longer\nadded.txt\ndeep\n",
        "second, longer\ndeep\n",
    ]
