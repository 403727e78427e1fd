"""The built-in suite on the Docker backend: every reference solution scores 1.0 and doing nothing 0.0."""

from __future__ import annotations

import subprocess
import sys

import pytest

from envs.tasks import builtin_task_ids
from tests.support.backends import backend_missing

pytestmark = [pytest.mark.docker, backend_missing("docker")]


def test_every_builtin_task_checks_out_on_docker() -> None:
    """python -m envs.check --backend docker (shared verification opted in for the two service tasks)."""
    done = subprocess.run(
        [sys.executable, "-m", "envs.check", "--backend", "docker", "-o", "shared_verification=true", "-j", "2"],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    n = len(builtin_task_ids())
    assert f"{n} of {n} tasks pass" in done.stdout
