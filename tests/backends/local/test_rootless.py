"""The local backend as an unprivileged user: the same contract, no host root."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

from tests.support.needs import needs, skip_missing

ROOT = Path(__file__).resolve().parents[3]
USER = "65534:65534"  # nobody

SCRIPT = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, {root!r})
    from pool import LocalBackend, Enforcement
    from pool.testing import check_backend
    with LocalBackend(store_dir={store!r}) as backend:
        assert backend.rootless
        assert backend.capabilities.limits["pids"] is Enforcement.RLIMIT
        # no way into the sandboxes' network namespaces: loopback only, and check_backend checks
        # that set_network refuses what it cannot enforce
        assert backend.capabilities.egress_control == "loopback-only"
        assert backend.capabilities.network_modes == ("no-network",)
        check_backend(backend)
        snap = backend.build(__import__("pool").Template(name="rootless", setup=["echo hi > f"], workdir="/w"))
        with backend.create(snap) as sbx:
            out = sbx.exec("id -u; cat /proc/self/uid_map; touch /usr/bin/x 2>&1; echo rc=$?").stdout
            print(out)
    print("ROOTLESS-OK")
    """
)


def _interpreter_for_nobody() -> str | None:
    for candidate in (sys.executable, "/usr/bin/python3"):
        probe = subprocess.run(
            [
                "setpriv",
                f"--reuid={USER.split(':')[0]}",
                f"--regid={USER.split(':')[1]}",
                "--clear-groups",
                candidate,
                "-c",
                "import sys; assert sys.version_info >= (3, 11)",
            ],
            capture_output=True,
        )
        if probe.returncode == 0:
            return candidate
    return None


@needs(os.geteuid() != 0, "needs root to switch to an unprivileged user")
def test_unprivileged_user_passes_check_backend() -> None:
    if shutil.which("setpriv") is None:
        skip_missing("setpriv (util-linux) is not installed")
    python = _interpreter_for_nobody()
    if python is None:
        skip_missing("no Python 3.11+ interpreter the unprivileged user can run")
    tmp_path = Path(tempfile.mkdtemp(prefix="snapgym-rootless-"))  # pytest's tmp dirs are root-only
    os.chmod(tmp_path, 0o777)
    script = tmp_path / "rootless.py"
    script.write_text(SCRIPT.format(root=str(ROOT), store=str(tmp_path / "store")))
    home = tmp_path / "home"
    home.mkdir(mode=0o777)
    os.chmod(home, 0o777)
    uid, gid = USER.split(":")
    proc = subprocess.run(
        ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", python, str(script)],
        capture_output=True,
        text=True,
        timeout=240,
        env={"PATH": os.environ["PATH"], "HOME": str(home), "XDG_RUNTIME_DIR": str(home)},
    )
    shutil.rmtree(tmp_path, ignore_errors=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "ROOTLESS-OK" in proc.stdout
    lines = proc.stdout.splitlines()
    assert lines[0] == "0"  # root inside the sandbox...
    assert lines[1].split() == ["0", "0", "1"]  # ...mapped to the unprivileged user, one id
    assert "rc=0" not in proc.stdout  # the host userland stays read-only


REFUSED_SCRIPT = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, {root!r})
    from pool import LocalBackend, Template, UnsupportedError
    backend = LocalBackend(store_dir={store!r}, runtime_dir={store!r} + "/run", rootless=True)
    try:
        backend.build(Template(name="refused", setup=["true"]))
    except UnsupportedError as exc:
        print("UNSUPPORTED:", exc)
    """
)


def test_without_user_namespaces_the_error_names_the_setting(tmp_path: Path) -> None:
    # A user namespace whose own user.max_user_namespaces is 0: the kernel
    # refuses every user namespace below it, as on a host where they are off.
    if shutil.which("unshare") is None:
        skip_missing("unshare (util-linux) is not installed")
    script = tmp_path / "refused.py"
    script.write_text(REFUSED_SCRIPT.format(root=str(ROOT), store=str(tmp_path / "store")))
    shell = f"echo 0 > /proc/sys/user/max_user_namespaces && exec {sys.executable} {script}"
    proc = subprocess.run(
        ["unshare", "--user", "--map-root-user", "sh", "-c", shell], capture_output=True, text=True, timeout=120
    )
    assert "UNSUPPORTED:" in proc.stdout, proc.stderr[-2000:]
    assert "max_user_namespaces" in proc.stdout and "run as root" in proc.stdout
