"""A Terminal-Bench-2-style task runs from its own image on every cloud backend, through the
provider's real SDK and its stand-in, the image served by a real registry on 127.0.0.1.

``python -m benchmarks.run backend=e2b|daytona|modal suite=dir``: the task's Dockerfile (FROM a
Debian image, COPY --from a tool image, RUN apt-get install, WORKDIR, COPY) is built in a provider
sandbox started from the pinned image, and its reference solution scores 1.0, doing nothing 0.0;
a task's prebuilt ``docker_image`` is used instead when it can be had, as Harbor does. What the
task asks for that the provider does not set is in the ledger. A tag that moves to other content
never starts an episode from the old snapshot.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from pool import Template, load_backend
from tests.support.fixtures.oci_fixtures import DebianImages, Registry, missing_tools
from tests.support.needs import needs
from tests.support.targets.tb2_images import PACKAGE, TaskImages, local_backend, write_tb2_task

pytest_plugins = ["tests.support.fixtures.oci_fixtures", "tests.support.targets.tb2_images"]
pytestmark = needs(missing_tools(), f"needs {', '.join(missing_tools())}")

REPO = Path(__file__).parents[3]


@dataclass
class Cloud:
    """A cloud backend over its stand-in: how the runner and this process reach it."""

    name: str
    standin: Any
    overrides: list[str]
    env: dict[str, str]
    options: dict[str, Any] = field(default_factory=dict)

    def backend(self) -> Any:
        return load_backend(self.name, **self.options)


@pytest.fixture(scope="module", params=["e2b", "daytona", "modal"])
def cloud(
    request: pytest.FixtureRequest, task_images: TaskImages, image_store: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cloud]:
    """The backend's stand-in over a local backend that reaches the test registry and apt repository."""
    name = str(request.param)
    folder = tmp_path_factory.mktemp(f"{name}-images")
    registry = {"insecure_registries": [task_images.registry]}
    with contextlib.ExitStack() as stack:
        local = stack.enter_context(local_backend(task_images, image_store))
        if name == "e2b":
            from tests.backends.cloud.e2b.standin import E2BStandin

            e2b = stack.enter_context(E2BStandin(local))
            options: dict[str, Any] = {"api_key": e2b.api_key, "api_url": e2b.url, "sandbox_url": e2b.url}
            yield Cloud(name, e2b, [f"backend.api_url={e2b.url}", f"backend.sandbox_url={e2b.url}"],
                        {"E2B_API_KEY": e2b.api_key}, {**options, "registry": registry})  # fmt: skip
        elif name == "daytona":
            from tests.backends.cloud.daytona.standin import DaytonaStandin

            daytona = stack.enter_context(DaytonaStandin(local))
            options = {"api_key": daytona.api_key, "api_url": daytona.url, "target": "us"}
            yield Cloud(name, daytona, [f"backend.api_url={daytona.url}", "backend.target=us"],
                        {"DAYTONA_API_KEY": daytona.api_key}, {**options, "registry": registry})  # fmt: skip
        else:
            from tests.backends.cloud.modal.standin import ModalStandin

            modal = stack.enter_context(ModalStandin(local))
            images = folder / "modal-images.json"
            options = {"token_id": modal.token_id, "token_secret": modal.token_secret, "server_url": modal.url,
                       "base_image": modal.base_image_id, "registry_file": str(images)}  # fmt: skip
            overrides = [f"backend.base_image={modal.base_image_id}", f"backend.registry_file={images}"]
            yield Cloud(name, modal, overrides, dict(modal.sdk_env), {**options, "registry": registry})


def copy_image(source: str, dest: str) -> None:
    """Copy an image between the test registry's names (a tag moved)."""
    subprocess.run(["skopeo", "--insecure-policy", "copy", "--quiet", "--src-tls-verify=false",
                    "--dest-tls-verify=false", f"docker://{source}", f"docker://{dest}"], check=True)  # fmt: skip


def run(cloud: Cloud, tasks: Path, agent: str, out: Path, registry: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """``python -m benchmarks.run backend=<cloud> suite=dir``: the summary and the result records."""
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.run", f"backend={cloud.name}", *cloud.overrides,
         f"backend.registry.insecure_registries=[{registry}]", "suite=dir", f"suite.path={tasks}", f"agent={agent}",
         "progress=false", "benchmark.plots=false", f"output_dir={out}", f"hydra.run.dir={out.parent / 'hydra'}"],
        cwd=REPO, env={**os.environ, **cloud.env}, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    records = [json.loads(line) for line in (out / "ledger.jsonl").read_text().splitlines()]
    return json.loads((out / "summary.json").read_text()), [r for r in records if r["kind"] == "result"]


def test_a_tb2_task_builds_from_its_dockerfile_and_scores_oracle_one_and_noop_zero(
    cloud: Cloud, task_images: TaskImages, tmp_path: Path
) -> None:
    tasks = tmp_path / "tasks"
    write_tb2_task(tasks, task_images)
    with cloud.backend() as backend:
        applied = backend.provider.applied_resources
    asked = {"cpus": "cpus=1", "memory_mb": "memory_mb=4096"}
    for agent, reward in (("oracle", 1.0), ("noop", 0.0)):
        summary, results = run(cloud, tasks, agent, tmp_path / agent, task_images.registry)
        assert summary["mean_reward"] == reward and summary["counts"].get("scored") == 1, summary
        (result,) = results
        assert result["provider"] == cloud.name
        assert result.get("resources_not_applied", []) == [text for key, text in asked.items() if key not in applied]


def test_a_prebuilt_docker_image_is_used_when_it_can_be_had(
    cloud: Cloud, task_images: TaskImages, debian_images: DebianImages, tmp_path: Path
) -> None:
    """task.toml ``docker_image`` replaces the Dockerfile (Harbor's default); the image's files are there."""
    task = write_tb2_task(tmp_path / "tasks", task_images)
    toml = (task / "task.toml").read_text()
    (task / "task.toml").write_text(
        toml.replace("[environment]\n", f'[environment]\ndocker_image = "{debian_images.sibling}"\n')
    )
    import envs

    loaded = envs.load_task(task)
    with cloud.backend() as backend:
        snapshot = backend.build(loaded.template)
        with backend.create(snapshot) as sandbox:
            seen = sandbox.exec(f"cat /etc/debian_version; command -v {PACKAGE} || echo no-{PACKAGE}; pwd")
    assert seen.ok and seen.stdout.startswith("12.") and f"no-{PACKAGE}" in seen.stdout, seen


def test_a_tag_moved_to_other_content_builds_anew(
    cloud: Cloud, debian_images: DebianImages, registry: Registry, tmp_path: Path
) -> None:
    """The snapshot is named after the image's digest: after the tag moves, the old start state is not reused."""
    if cloud.name != "e2b":
        pytest.skip("the name is the shared layer's; one provider shows it")
    moving = f"{registry.host}/test/moving:1"
    copy_image(debian_images.base, moving)
    template = Template(name="moving", base=moving, setup=["cat /etc/snapgym-release 2>/dev/null > /seen || true"])
    with cloud.backend() as backend:
        first = backend.build(template)
        copy_image(debian_images.whiteouts, moving)
        with cloud.backend() as fresh:  # another process's view: the tag is resolved anew
            second = fresh.build(template)
            with fresh.create(second) as sandbox:
                assert sandbox.read_file("/seen") == b"whiteouts\n"
    assert first.layers[0] != second.layers[0] and first.digest != second.digest
