"""Toolchain verification on the local backend: strict mode plus what the agent added where packages install.

The image has an interpreter of its own under /opt (a venv on PATH, as python:3.13-slim's
/usr/local one) with a package installed. What the agent adds there reaches the verifier;
what it changes, hooks, shadows, upgrades and links out of the install roots do not, and
``install_delta`` names each with its rule.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from pool import LocalBackend, LocalSandbox, Snapshot, Template, UnsupportedError
from pool.verification import VerificationPlan, VerifyMode

SITE = "/opt/python/site"
"""The venv's site-packages, linked at a fixed path by the template (its real name has the version)."""
VENV = Template(
    name="tests-verify-toolchain",
    setup=[
        "python3 -m venv --without-pip /opt/python && mkdir -p /app",
        "ln -s $(/opt/python/bin/python3 -c 'import site; print(site.getsitepackages()[0])') /opt/python/site",
        "mkdir -p /opt/python/site/known /opt/python/site/known-1.0.dist-info && echo 'V = 1' > "
        "/opt/python/site/known/__init__.py && printf 'known/__init__.py,,\\n' > "
        "/opt/python/site/known-1.0.dist-info/RECORD",
    ],
    workdir="/app",
    env={"PATH": "/opt/python/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
)


@pytest.fixture(scope="module")
def tests_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("toolchain-tests")
    (folder / "test.sh").write_text("#!/bin/bash\necho 0 > /logs/verifier/reward.txt\n")
    return folder


@pytest.fixture(scope="module")
def venv(backend: LocalBackend) -> Snapshot:
    return backend.build(VENV)


@pytest.fixture()
def sandbox(backend: LocalBackend, venv: Snapshot) -> Iterator[LocalSandbox]:
    with backend.create(venv) as sbx:
        yield sbx


def toolchain(tests: Path, known_good: Snapshot) -> VerificationPlan:
    return VerificationPlan(VerifyMode.TOOLCHAIN, tests, outputs=("/app",), known_good=known_good)


def site(sandbox: LocalSandbox) -> str:
    return sandbox.exec(f"readlink -f {SITE}").stdout.strip()


def test_a_new_package_reaches_the_verifier_and_its_interpreter_stays_known_good(
    sandbox: LocalSandbox, venv: Snapshot, tests_dir: Path
) -> None:
    real = site(sandbox)
    sandbox.exec(
        f"mkdir -p {SITE}/sgeigen {SITE}/sgeigen-1.0.dist-info && echo 'def largest(): return 42' > "
        f"{SITE}/sgeigen/__init__.py && printf 'sgeigen/__init__.py,,\\n' > {SITE}/sgeigen-1.0.dist-info/RECORD && "
        "echo 'print(\"import sgeigen; print(sgeigen.largest())\")' > /app/eigen.py && "
        "rm /opt/python/bin/python3 && printf '#!/bin/sh\\necho forged\\n' > /opt/python/bin/python3 && "
        "chmod +x /opt/python/bin/python3 && printf '#!/bin/sh\\necho forged\\n' > /opt/python/bin/cat && "
        "chmod +x /opt/python/bin/cat && mkdir -p /opt/newtool/bin && echo tool > /opt/newtool/bin/newtool"
    )
    report = sandbox.begin_verification(toolchain(tests_dir, venv))
    assert report.mode is VerifyMode.TOOLCHAIN and report.install_delta is not None
    delta = report.install_delta.as_info()
    assert f"{real}/sgeigen/__init__.py" in delta["grafted"] and "/opt/newtool/bin/newtool" in delta["grafted"]
    rules = {entry["path"]: entry["rule"] for entry in delta["dropped"]}
    assert rules["/opt/python/bin/python3"].startswith("the known-good snapshot has this path"), rules
    assert rules["/opt/python/bin/cat"] == "shadows the known-good command 'cat' on PATH", rules
    probe = sandbox.exec("python3 -c 'import sgeigen; print(sgeigen.largest())'; cat /opt/newtool/bin/newtool; ls /app")
    assert probe.stdout == "42\ntool\neigen.py\n", probe.stdout + probe.stderr


def test_hooks_shadows_and_edits_of_known_good_modules_stay_behind(
    sandbox: LocalSandbox, venv: Snapshot, tests_dir: Path
) -> None:
    real = site(sandbox)
    sandbox.exec(
        f"echo 'import os' > {SITE}/zz.pth && echo 'X = 1' > {SITE}/sitecustomize.py && "
        f"mkdir -p {SITE}/json {SITE}/pytest && echo 'dumps = 1' > {SITE}/json/__init__.py && "
        f"echo 'forged = 1' > {SITE}/pytest/__init__.py && echo 'forged = 1' >> {SITE}/known/__init__.py && "
        f"echo 'forged = 1' > {SITE}/known/extra.py && mkdir -p {SITE}/plug-1.0.dist-info && "
        f"printf '[pytest11]\\nplug = plugmod\\n' > {SITE}/plug-1.0.dist-info/entry_points.txt && "
        f"echo 'forged = 1' > {SITE}/plugmod.py && echo /x.so > /etc/ld.so.preload && "
        "mkdir -p /etc/profile.d /etc/newpkg && echo 'export X=1' > /etc/profile.d/zz.sh && echo ok > /etc/newpkg/conf"
    )
    report = sandbox.begin_verification(toolchain(tests_dir, venv))
    assert report.install_delta is not None
    rules = {entry["path"]: entry["rule"] for entry in report.install_delta.as_info()["dropped"]}
    assert rules[f"{real}/zz.pth"] == "a start-up hook (*.pth) that every Python would run"
    assert rules[f"{real}/sitecustomize.py"].startswith("a start-up hook (sitecustomize")
    assert rules[f"{real}/json"] == "shadows the standard-library module 'json'"
    assert rules[f"{real}/pytest"].startswith("shadows the verifier's own tool 'pytest'")
    assert rules[f"{real}/known"] == "shadows 'known', which the known-good interpreters import already"
    assert rules[f"{real}/known/__init__.py"].startswith("the known-good snapshot has this path")
    assert "pytest plugin (pytest11 entry point)" in rules[f"{real}/plug-1.0.dist-info"]
    assert rules[f"{real}/plugmod.py"] == rules[f"{real}/plug-1.0.dist-info"]
    assert rules["/etc/ld.so.preload"].startswith("/etc: only a new folder")
    assert rules["/etc/profile.d"].startswith("/etc: configuration of the loader")
    assert report.install_delta.grafted == ("/etc/newpkg/conf",)
    probe = sandbox.exec(
        f"ls -A {SITE}; cat {SITE}/known/__init__.py; ls /etc/ld.so.preload /etc/profile.d/zz.sh 2>&1 | wc -l; "
        "python3 -c 'import json, known; print(json.dumps(known.V))'"
    )
    assert probe.stdout.split() == ["known", "known-1.0.dist-info", "V", "=", "1", "2", "1"], probe.stdout


def test_an_upgrade_of_a_distribution_the_snapshot_has_is_dropped_and_named(
    sandbox: LocalSandbox, venv: Snapshot, tests_dir: Path
) -> None:
    real = site(sandbox)
    sandbox.exec(  # as pip install --upgrade does: the old dist-info goes, a new one comes, files change
        f"rm -r {SITE}/known-1.0.dist-info && mkdir -p {SITE}/known-2.0.dist-info && echo 'V = 2' > "
        f"{SITE}/known/__init__.py && echo 'N = 2' > {SITE}/known/new.py && "
        f"printf 'known/__init__.py,,\\nknown/new.py,,\\n' > {SITE}/known-2.0.dist-info/RECORD"
    )
    report = sandbox.begin_verification(toolchain(tests_dir, venv))
    assert report.install_delta is not None
    rules = {entry["path"]: entry["rule"] for entry in report.install_delta.as_info()["dropped"]}
    assert rules[f"{real}/known-2.0.dist-info"].startswith("an upgrade of the distribution 'known'"), rules
    assert report.install_delta.grafted == ()
    probe = sandbox.exec(f"ls {SITE} {SITE}/known; python3 -c 'import known; print(known.V)'")
    assert probe.stdout.split() == [f"{SITE}:", "known", "known-1.0.dist-info", f"{SITE}/known:", "__init__.py", "1"]


def test_links_out_of_the_install_roots_are_neither_followed_nor_grafted(
    sandbox: LocalSandbox, venv: Snapshot, tests_dir: Path
) -> None:
    real = site(sandbox)
    sandbox.exec(
        f"ln -s /etc/shadow {SITE}/shadow && ln -s / {SITE}/root && ln -s ../../../../../logs/verifier {SITE}/up && "
        f"mkdir -p {SITE}/newpkg && ln -s ../known {SITE}/newpkg/inside && echo x > {SITE}/newpkg/__init__.py"
    )
    report = sandbox.begin_verification(toolchain(tests_dir, venv))
    assert report.install_delta is not None
    rules = {entry["path"]: entry["rule"] for entry in report.install_delta.as_info()["dropped"]}
    for name, target in (("shadow", "/etc/shadow"), ("root", "/"), ("up", "../../../../../logs/verifier")):
        assert rules[f"{real}/{name}"] == (
            f"a link that leads outside the install roots (-> {target}): not followed, not grafted"
        ), rules
    assert f"{real}/newpkg/inside" in report.install_delta.grafted
    probe = sandbox.exec(f"ls -A {SITE}; readlink {SITE}/newpkg/inside")
    assert probe.stdout.split() == ["known", "known-1.0.dist-info", "newpkg", "../known"], probe.stdout


def test_nothing_added_grafts_nothing_and_a_checkpoint_is_refused(
    backend: LocalBackend, sandbox: LocalSandbox, venv: Snapshot, tests_dir: Path
) -> None:
    report = sandbox.begin_verification(toolchain(tests_dir, venv))
    assert report.install_delta is not None and report.install_delta.grafted == ()
    assert sandbox.exec("ls /opt/python/site").stdout.split() == ["known", "known-1.0.dist-info"]
    sandbox.restore()
    sandbox.exec("echo x > /app/x")
    checkpoint = sandbox.snapshot()
    with backend.create(checkpoint) as resumed, pytest.raises(UnsupportedError, match="from a checkpoint is not built"):
        resumed.begin_verification(toolchain(tests_dir, venv))


def test_the_host_is_untouched_by_a_link_the_agent_planted(
    sandbox: LocalSandbox, venv: Snapshot, tests_dir: Path
) -> None:
    """The copy of the agent's layer never writes through its links: a host file they name keeps its content."""
    probe = Path("/tmp") / f"snapgym-toolchain-probe-{os.getpid()}"
    probe.write_text("host\n")
    try:
        sandbox.exec(f"mkdir -p /opt/evil && ln -s {probe} /opt/evil/probe && ln -s /tmp /opt/evil/tmp")
        sandbox.exec("mkfifo /opt/evil/pipe")
        report = sandbox.begin_verification(toolchain(tests_dir, venv))
        assert probe.read_text() == "host\n"
        assert report.install_delta is not None
        assert ("/opt/evil/pipe", "not a regular file, folder or link") in report.install_delta.dropped
        assert not sandbox.exec("test -e /opt/evil").ok, "nothing of /opt/evil is grafted"
    finally:
        probe.unlink()
