"""`RUN pip install` in a task's Dockerfile works on the host base, offline, through a local wheel."""

from __future__ import annotations

import base64
import hashlib
import zipfile
from pathlib import Path

from envs import ShellEnv
from pool import LocalBackend

WHEEL = "snapgym_probe-0.1-py3-none-any.whl"
_FILES = {
    "snapgym_probe/__init__.py": "VALUE = 42\n",
    "snapgym_probe-0.1.dist-info/METADATA": "Metadata-Version: 2.1\nName: snapgym-probe\nVersion: 0.1\n",
    "snapgym_probe-0.1.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: snapgym-tests\nRoot-Is-Purelib: true\n"
    "Tag: py3-none-any\n",
}


def _write_wheel(path: Path) -> None:
    record = []
    with zipfile.ZipFile(path, "w") as wheel:
        for name, text in _FILES.items():
            data = text.encode()
            wheel.writestr(name, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            record.append(f"{name},sha256={digest},{len(data)}")
        record.append("snapgym_probe-0.1.dist-info/RECORD,,")
        wheel.writestr("snapgym_probe-0.1.dist-info/RECORD", "\n".join(record) + "\n")


def test_pip_install_in_a_dockerfile_lands_in_the_snapshot(tmp_path: Path, backend: LocalBackend) -> None:
    """pip installs for the sandbox's root; the package imports in every episode."""
    task = tmp_path / "pip-task"
    (task / "environment").mkdir(parents=True)
    (task / "tests").mkdir()
    _write_wheel(task / "environment" / WHEEL)
    (task / "environment" / "Dockerfile").write_text(
        f"FROM snapgym/host\nWORKDIR /app\nCOPY {WHEEL} /tmp/\nRUN pip install --no-index /tmp/{WHEEL}\n"
    )
    (task / "instruction.md").write_text("Nothing to do.\n")
    (task / "task.toml").write_text('version = "1.0"\n')
    (task / "tests" / "test.sh").write_text("mkdir -p /logs/verifier && echo 1 > /logs/verifier/reward.txt\n")
    env = ShellEnv(task, backend=backend)
    try:
        for _ in range(2):
            env.reset()
            obs, *_ = env.step("python3 -c 'import snapgym_probe; print(snapgym_probe.VALUE)'")
            assert obs["output"].startswith("42\n"), obs["output"]
            obs, *_ = env.step("test -d /.snapgym-build && echo shims-left || echo clean")
            assert obs["output"].startswith("clean"), "the build-time shims must not stay in the snapshot"
    finally:
        env.close()
