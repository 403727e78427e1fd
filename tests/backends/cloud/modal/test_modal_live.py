"""The Modal backend against Modal itself: run only when asked (``SNAPGYM_LIVE=1``) and a token is
present, since it starts billed (GPU) sandboxes. The conformance suite on CPU sandboxes, and the
GPU smoke task (benchmarks/tasks/gpu-smoke: nvidia-smi and, where PyTorch is installed, a CUDA
kernel) and a task in its own CUDA image (benchmarks/tasks/gpu-torch) scoring oracle 1.0 / no-op 0.0
on a Modal GPU sandbox."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

import envs
from pool.testing import check_backend

pytestmark = [
    pytest.mark.live,
    pytest.mark.skipif(
        os.environ.get("SNAPGYM_LIVE") != "1"
        or not (os.environ.get("MODAL_TOKEN_ID") or Path("~/.modal.toml").expanduser().is_file()),
        reason="live Modal tests need SNAPGYM_LIVE=1 and a Modal token (they start billed GPU sandboxes)",
    ),
]
GPU_SMOKE = Path(__file__).parents[4] / "benchmarks" / "tasks" / "gpu-smoke"
GPU_TORCH = Path(__file__).parents[4] / "benchmarks" / "tasks" / "gpu-torch"


@pytest.fixture(scope="module")
def live_backend() -> Iterator[object]:
    from pool.backends.modal import ModalBackend

    with ModalBackend(sandbox_timeout_s=900) as backend:
        yield backend


def test_the_conformance_suite_passes_on_modal(live_backend: object) -> None:
    check_backend(live_backend)  # type: ignore[arg-type]


def test_the_gpu_smoke_task_runs_on_a_modal_gpu(live_backend: object) -> None:
    check = envs.check_task(live_backend, envs.load_task(GPU_SMOKE))  # type: ignore[arg-type]
    assert (check.oracle.reward, check.noop.reward) == (1.0, 0.0), check.oracle


def test_a_gpu_task_runs_in_its_own_cuda_image(live_backend: object) -> None:
    """benchmarks/tasks/gpu-torch: FROM pytorch/pytorch (CUDA 12.4), a GPU, 4 CPUs and 16 GiB: the
    image is resolved here, pulled by Modal, and PyTorch computes on the sandbox's GPU."""
    check = envs.check_task(live_backend, envs.load_task(GPU_TORCH))  # type: ignore[arg-type]
    assert (check.oracle.reward, check.noop.reward) == (1.0, 0.0), check.oracle
