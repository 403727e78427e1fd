"""The Modal backend on the inputs the SDK gets wrong first (issue 29), through the real SDK against the
stand-in: output that is not UTF-8 (the SDK's text mode decodes strictly), a multibyte character cut at
the cap, a command past the SDK's 64 KiB argument limit, tags from the moment of the create, and the
built-in task ``top-ips`` (a task file over 48 KiB) built and scored."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from pool import SnapshotNotFoundError, Template
from pool.backends.modal import ModalBackend
from tests.backends.cloud.modal.standin import ModalStandin

pytest_plugins = ["tests.backends.cloud.modal.standin"]

TEMPLATE = Template(name="modal-hard", setup=["mkdir -p /w"], workdir="/w")


@pytest.fixture
def modal_backend(modal_standin: ModalStandin, tmp_path: Path) -> Iterator[ModalBackend]:
    with ModalBackend(
        token_id=modal_standin.token_id, token_secret=modal_standin.token_secret, server_url=modal_standin.url,
        base_image=modal_standin.base_image_id, registry_file=str(tmp_path / "images.json"),
    ) as backend:  # fmt: skip
        yield backend


def test_output_that_is_not_utf8_comes_back_replaced_not_raised(modal_backend: ModalBackend) -> None:
    with modal_backend.create(modal_backend.build(TEMPLATE)) as sandbox:
        r = sandbox.exec("printf 'ok\\377\\n'; printf '\\376' >&2")
        assert (r.stdout, r.stderr) == ("ok\ufffd\n", "\ufffd")
        r = sandbox.exec("printf 'ab\\342\\202\\254'", max_output_bytes=4)
        assert r.stdout == "ab\ufffd" and r.stdout_truncated


def test_a_command_past_the_sdks_64_kib_argument_limit_runs(modal_backend: ModalBackend) -> None:
    with modal_backend.create(modal_backend.build(TEMPLATE)) as sandbox:
        r = sandbox.exec(": '" + "y" * (100 << 10) + "'; echo ran; ls /tmp | grep -c snapgym-script || true")
        assert r.stdout == "ran\n0\n", r


def test_tags_are_set_by_the_create_itself(modal_standin: ModalStandin, modal_backend: ModalBackend) -> None:
    with modal_backend.create(modal_backend.build(TEMPLATE), labels={"team": "a"}) as sandbox:
        creates = [r for r in modal_standin.requests if r.rpc.startswith("SandboxCreate") and r.status == "OK"]
        tags = {t["tag_name"]: t.get("tag_value") for t in creates[-1].fields.get("tags", [])}
        assert tags.get("team") == "a" and sandbox.labels["team"] == "a"
    assert not [r for r in modal_standin.requests if r.rpc.startswith("SandboxTagsSet")]


def test_the_builtin_task_top_ips_builds_and_scores_on_modal(modal_standin: ModalStandin, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.run", "backend=modal", f"backend.base_image={modal_standin.base_image_id}",
         f"backend.registry_file={tmp_path / 'images.json'}", "agent=oracle", "suite.include=[top-ips]",
         "progress=false", "benchmark.plots=false", f"output_dir={run_dir}", f"hydra.run.dir={tmp_path / 'hydra'}"],
        cwd=Path(__file__).parents[4], env={**os.environ, **modal_standin.sdk_env},
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["mean_reward"] == 1.0 and summary["counts"].get("scored") == 1, summary


def test_an_expired_image_is_built_again_and_its_snapshot_is_not_found(
    modal_standin: ModalStandin, modal_backend: ModalBackend, tmp_path: Path
) -> None:
    first = modal_backend.build(TEMPLATE)
    modal_standin.expire_image(first.layers[0])  # Modal expires snapshot images (30 days by default)
    with pytest.raises(SnapshotNotFoundError, match="no longer has the image"):
        modal_backend.create(first)
    second = modal_backend.build(TEMPLATE)
    assert second.layers[0] != first.layers[0]
    assert first.layers[0] not in json.loads((tmp_path / "images.json").read_text()).values()
    with modal_backend.create(second) as sandbox:
        assert sandbox.exec("ls -d /w").stdout == "/w\n"


def test_a_sandbox_that_ends_while_the_reaper_lists_it_does_not_abort_the_reap(
    modal_standin: ModalStandin, modal_backend: ModalBackend
) -> None:
    snapshot = modal_backend.build(TEMPLATE)
    made = [modal_backend.create(snapshot, labels={"snapgym.run": "r9"}) for _ in range(2)]
    for rpc in ("SandboxTagsGet", "SandboxTagsGetV2"):  # the one listing uses: the sandbox ended since the list
        modal_standin.fail_next(rpc, "NOT_FOUND", message="sandbox ended")
    found = modal_backend.reap_run("r9")
    assert any(r.rpc.startswith("SandboxTagsGet") and r.status != "OK" for r in modal_standin.requests)
    assert found and {str(sandbox.remote_id) for sandbox in made} & set(found)
