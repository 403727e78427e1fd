"""A Terminal-Bench-2-style task runs from its own image, as it would in Harbor, on every backend.

The task's Dockerfile starts ``FROM`` a Debian image (built from Debian packages, served by a
real registry on 127.0.0.1), copies a tool out of another image (``COPY --from``), installs a
package with ``apt-get install`` from an apt repository the test serves, asks for 4G of memory,
and its reference solution is a 70 KB ``solve.sh``. The reference solution must score 1.0 and
doing nothing 0.0, on the local backend (no Docker engine: skopeo and overlayfs) and on the
Docker backend (the engine's own builder); and the two start states hold the same files.
"""

from __future__ import annotations

import subprocess
import tarfile
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest

import envs
from pool import Backend, LocalBackend, load_backend
from pool.build.registry.settings import RegistrySettings
from tests.support.backends import backend_params, need_backend
from tests.support.fixtures.oci_fixtures import (
    DebianImages,
    Registry,
    missing_tools,
)
from tests.support.needs import needs
from tests.support.targets.tb2_images import FILES_DIGEST, PACKAGE, TaskImages, local_backend, write_tb2_task

pytest_plugins = ["tests.support.fixtures.oci_fixtures", "tests.support.targets.tb2_images"]

pytestmark = needs(missing_tools(), f"needs {', '.join(missing_tools())}")


@pytest.fixture(scope="module", params=backend_params())
def image_backend(request: pytest.FixtureRequest, task_images: TaskImages, image_store: Path) -> Iterator[Backend]:
    """Each backend, able to reach the test registry (plain HTTP on 127.0.0.1)."""
    if request.param == "local":
        backend: Backend = local_backend(task_images, image_store)
    else:
        backend = load_backend(str(request.param))
    try:
        yield backend
    finally:
        backend.close()


def test_a_tb2_style_task_scores_oracle_one_and_noop_zero(
    image_backend: Backend, task_images: TaskImages, tmp_path: Path
) -> None:
    """FROM <image>, COPY --from=<image>, RUN apt-get install, memory = "4G" and a 70 KB solve.sh."""
    task = envs.load_task(write_tb2_task(tmp_path, task_images))
    check = envs.check_task(image_backend, task)
    assert (check.oracle.reward, check.noop.reward) == (1.0, 0.0), (check.oracle.output[-2000:], check.noop)
    snapshot = image_backend.build(task.template)
    assert snapshot.resources.memory_mb == 4096
    apt = urllib.parse.urlsplit(task_images.apt_url).netloc
    if image_backend.name == "local":  # RUN apt-get went through the egress proxy, on record
        assert snapshot.build_network["route"] == "proxy", snapshot.build_network
        assert apt in snapshot.build_network["audit"]["hosts"]["allowed"], snapshot.build_network
    else:  # the engine's builder gave RUN the bridge: not filtered, and the record says so
        assert snapshot.build_network["builder_route"] == "direct", snapshot.build_network
    assert snapshot.workdir == "/app"
    with image_backend.create(snapshot) as sandbox:
        r = sandbox.exec(f"{PACKAGE}; uv; cat /etc/debian_version; id -u; pwd")
        assert r.stdout.startswith("hello from a Debian package\nuv 0.0-test\n12."), r
        assert r.stdout.endswith("0\n/app\n")


def test_the_same_image_gives_the_same_files_on_every_backend(
    task_images: TaskImages, tmp_path: Path, image_store: Path
) -> None:
    """The start state built from the task's image holds the same files on the local and the Docker backend."""
    need_backend("docker")
    task = envs.load_task(write_tb2_task(tmp_path, task_images))
    digests = {}
    local = local_backend(task_images, image_store)
    docker = load_backend("docker")
    try:
        for name, backend in (("local", local), ("docker", docker)):
            with backend.create(backend.build(task.template)) as sandbox:
                result = sandbox.exec(FILES_DIGEST)
                assert result.ok, result
                digests[name] = result.stdout
    finally:
        local.close()
        docker.close()
    assert digests["local"] == digests["docker"]


def test_a_missing_image_fails_the_build_and_says_how_to_provide_it(
    task_images: TaskImages, tmp_path: Path, image_store: Path
) -> None:
    """An image the registry does not have is an ImageError naming it and the ways to provide it."""
    task_dir = write_tb2_task(tmp_path, task_images)
    dockerfile = task_dir / "environment" / "Dockerfile"
    dockerfile.write_text(dockerfile.read_text().replace(task_images.base, f"{task_images.registry}/test/nope:1"))
    task = envs.load_task(task_dir)
    with (
        local_backend(task_images, image_store) as backend,
        pytest.raises(envs.errors.ConfigError) as raised,
    ):
        backend.build(task.template)
    message = str(raised.value)
    assert "test/nope:1" in message and ("docker-archive" in message or "credentials" in message), message


def test_a_tarball_of_the_image_is_another_source(task_images: TaskImages, tmp_path: Path, image_store: Path) -> None:
    """bases={image: "docker-archive:..."} builds the same task from a `docker save`-style archive, offline."""
    archive = tmp_path / "debian.tar"
    subprocess.run(
        ["skopeo", "--insecure-policy", "copy", "--quiet", "--src-tls-verify=false",
         f"docker://{task_images.base}", f"docker-archive:{archive}:debian:bookworm"],
        check=True, capture_output=True,
    )  # fmt: skip
    assert tarfile.is_tarfile(archive)
    task_dir = write_tb2_task(tmp_path, task_images)
    task = envs.load_task(task_dir, bases={task_images.base: f"docker-archive:{archive}"})
    with local_backend(task_images, image_store) as backend:
        check = envs.check_task(backend, task)
    assert (check.oracle.reward, check.noop.reward) == (1.0, 0.0)


@pytest.mark.parametrize(
    ("prebuilt", "prefer", "from_dockerfile"),
    [("sibling", True, False), ("sibling", False, True), ("missing", True, True)],
    ids=["prebuilt-used", "prebuilt-not-preferred", "prebuilt-missing"],
)
def test_a_prebuilt_docker_image_is_used_when_it_can_be_had(
    debian_images: DebianImages,
    registry: Registry,
    tmp_path: Path,
    image_store: Path,
    prebuilt: str,
    prefer: bool,
    from_dockerfile: bool,
) -> None:
    """task.toml docker_image replaces the Dockerfile when the backend can get it and prefers prebuilt images."""
    image = debian_images.sibling if prebuilt == "sibling" else f"{registry.host}/test/missing:1"
    task_dir = tmp_path / "prebuilt"
    for folder in ("environment", "tests"):
        (task_dir / folder).mkdir(parents=True)
    (task_dir / "instruction.md").write_text("Nothing to do.\n")
    (task_dir / "task.toml").write_text(f'version = "1.0"\n[environment]\ndocker_image = "{image}"\n')
    (task_dir / "tests" / "test.sh").write_text("#!/bin/sh\necho 1 > /logs/verifier/reward.txt\n")
    (task_dir / "environment" / "Dockerfile").write_text(
        f"FROM {debian_images.base}\nRUN echo from-the-dockerfile > /marker\nWORKDIR /app\n"
    )
    settings = RegistrySettings(insecure_registries=[registry.host])
    with LocalBackend(store_dir=image_store, registry=settings, prefer_prebuilt=prefer) as backend:
        snapshot = backend.build(envs.load_task(task_dir).template)
        with backend.create(snapshot) as sandbox:
            marker = sandbox.exec("cat /marker 2>/dev/null || echo none").stdout.strip()
    assert marker == ("from-the-dockerfile" if from_dockerfile else "none")
