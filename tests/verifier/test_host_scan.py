"""The protection scan from the host (``pool.backends.local.instance.viewscan``) sees what ``find`` sees.

A strict verifier's view of the outputs is listed by the host walking the verifier's mount namespace
instead of ``sh`` + ``find`` in the sandbox. An agent must not be able to hide a planted file from
it, nor lead the host anywhere through it: the listing is compared with ``find``'s over a tree built
to tell them apart (whiteouts, opaque folders, links to folders and to host paths, an unreadable
folder, hard links, FIFOs, set-id modes, a link the graft removes), and the walk is shown not to
follow links on the host.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from envs.tasks.protect import ADDED_ONLY, CACHES, DEFAULT_PROTECTED, KnownGood, find_listing, protect
from pool import LocalBackend, LocalSandbox, Snapshot, Template
from pool.backends.local.instance import viewscan
from pool.contract import ListsVerifierView
from pool.verification import VerificationPlan, VerifyMode

PATTERNS = (*DEFAULT_PROTECTED, *ADDED_ONLY, *CACHES)
APP = Template(
    name="tests-host-scan",
    setup=[
        "mkdir -p /app/old /app/opaque/deep /app/keep && echo kg > /app/old/conftest.py",
        "echo kg > /app/opaque/conftest.py && echo kg > /app/opaque/deep/pytest.ini && echo kg > /app/keep/tox.ini",
    ],
    workdir="/app",
)
AGENT = " && ".join(
    [
        "echo hook > /app/conftest.py && chmod 4755 /app/conftest.py",  # a set-id mode
        "mkdir -p /app/a/b/c/d/e && echo hook > /app/a/b/c/d/e/conftest.py",
        "mkdir -p /app/pytest/sub && echo x > /app/pytest/__init__.py && echo x > /app/pytest/sub/conftest.py",
        "mkdir -p /app/__pycache__ && echo x > /app/__pycache__/m.pyc",
        "rm /app/old/conftest.py",  # a whiteout: the known-good file is gone from the agent's view
        "rm -rf /app/opaque && mkdir -p /app/opaque && echo x > /app/opaque/other",  # an opaque folder
        "mkdir -p /host-only && echo x > /host-only/conftest.py && ln -s /host-only /app/to-folder",  # not followed
        "ln -s / /app/to-root && ln -s /etc/passwd /app/setup.cfg && ln -s /tests/test.sh /app/pytest.ini",
        "mkdir -p /app/locked && echo hook > /app/locked/conftest.py && chmod 000 /app/locked",
        "mkdir -p /app/h && ln /app/conftest.py /app/h/sitecustomize.py",  # a hard link
        "mkfifo /app/tox.ini && mkdir -p /app/x.pth",
        "mkdir -p \"/app/$(printf '\\377')\" && echo hook > \"/app/$(printf '\\377')/conftest.py\"",  # not UTF-8
    ]
)


@pytest.fixture(scope="module")
def app(backend: LocalBackend) -> Snapshot:
    return backend.build(APP)


@pytest.fixture(scope="module")
def tests_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("scan-tests")
    (folder / "test.sh").write_text("#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n")
    return folder


@pytest.fixture()
def sealed(backend: LocalBackend, app: Snapshot, tests_dir: Path) -> Iterator[LocalSandbox]:
    with backend.create(app) as sandbox:
        done = sandbox.exec(AGENT)
        assert done.exit_code == 0, done.stderr
        sandbox.begin_verification(VerificationPlan(VerifyMode.STRICT, tests_dir, outputs=("/app",), known_good=app))
        yield sandbox


def test_the_host_lists_what_find_lists(sealed: LocalSandbox) -> None:
    assert isinstance(sealed, ListsVerifierView)
    on_host = sealed.list_verifier_view(("/app",), PATTERNS)
    assert on_host is not None
    assert on_host == find_listing(sealed, ("/app",), PATTERNS, inside=False)  # names that are not UTF-8 too
    assert on_host["/app/conftest.py"] == ("f", 0o4755)
    assert on_host["/app/setup.cfg"][0] == "l" and on_host["/app/pytest"][0] == "d"
    for planted in ("/app/a/b/c/d/e/conftest.py", "/app/locked/conftest.py", "/app/h/sitecustomize.py",
                    "/app/__pycache__", "/app/x.pth", "/app/\udcff/conftest.py", "/app/keep/tox.ini"):  # fmt: skip
        assert planted in on_host
    for hidden in ("/app/old/conftest.py", "/app/opaque/conftest.py", "/app/opaque/deep/pytest.ini",
                   "/app/pytest/sub/conftest.py", "/app/tox.ini", "/app/pytest.ini"):  # fmt: skip
        assert hidden not in on_host  # gone, under a matched folder, a FIFO, or a link the graft removed
    assert not any(p.startswith(("/app/to-folder/", "/app/to-root/")) for p in on_host)


def test_protect_removes_what_the_host_lists_even_under_a_name_find_cannot_print(sealed: LocalSandbox) -> None:
    done = protect(sealed, ("/app",), KnownGood(DEFAULT_PROTECTED, ADDED_ONLY))
    assert "/app/\udcff/conftest.py" in done.removed and "/app/locked/conftest.py" in done.removed
    left = sealed.exec("find /app -name conftest.py -o -name sitecustomize.py -o -name __pycache__ | wc -l")
    assert left.stdout.strip() == "0"


def test_nothing_is_listed_from_the_host_before_the_seal(backend: LocalBackend, app: Snapshot) -> None:
    with backend.create(app) as sandbox:
        assert sandbox.list_verifier_view(("/app",), PATTERNS) is None


def test_the_walk_follows_no_link_on_the_host(tmp_path: Path) -> None:
    """The host's own tree, through its own root: a link to a folder holding a planted name is listed as
    a link and never entered; an output reached through a link is left to find."""
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "conftest.py").write_text("x")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "sub").symlink_to(tmp_path / "elsewhere")
    (tmp_path / "out" / "conftest.py").symlink_to(tmp_path / "elsewhere" / "conftest.py")
    (tmp_path / "via").symlink_to(tmp_path / "out")
    listed = viewscan.scan(os.getpid(), (str(tmp_path / "out"),), PATTERNS)
    assert listed == {f"{tmp_path}/out/conftest.py": ("l", 0o777)}
    assert viewscan.scan(os.getpid(), (str(tmp_path / "via"),), PATTERNS) is None
    assert viewscan.scan(os.getpid(), (str(tmp_path / "missing"),), PATTERNS) == {}


def test_patterns_find_reads_differently_are_left_to_find(tmp_path: Path) -> None:
    assert viewscan.scan(os.getpid(), (str(tmp_path),), ("[!a]*.py",)) is None
    assert viewscan.scan(os.getpid(), (str(tmp_path),), ("conf\\test.py",)) is None


def test_a_process_that_is_gone_is_not_scanned(tmp_path: Path) -> None:
    child = os.fork()
    if child == 0:
        os._exit(0)
    os.waitpid(child, 0)
    assert viewscan.scan(child, (str(tmp_path),), PATTERNS) is None
