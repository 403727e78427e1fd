"""A stored suite starts without its registry: a tag resolved before is used at the digest it named
then, when (and only when) the registry cannot be reached; errors name every image wanted and the
command-line ways to provide it."""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from pool import DockerBuild, LocalBackend, RegistryUnreachableError, Template
from pool.build.registry.settings import RegistrySettings
from tests.support.fixtures.oci_fixtures import DebianImages, Registry, missing_tools, push, start_registry
from tests.support.needs import needs

pytest_plugins = ["tests.support.fixtures.oci_fixtures"]
pytestmark = needs(missing_tools(), f"needs {', '.join(missing_tools())}")


@pytest.fixture
def own_registry(tmp_path: Path, debian_images: DebianImages) -> Iterator[Registry]:
    """A registry of this test alone (it is stopped in the test), holding the Debian image."""
    registry = start_registry(tmp_path / "registry")
    push(debian_images.layout.ref("base"), registry, "test/debian:bookworm")
    yield registry
    registry.stop()


def backend(store: Path, registry: Registry) -> LocalBackend:
    return LocalBackend(store_dir=store, registry=RegistrySettings(insecure_registries=[registry.host]))


def test_a_stored_template_builds_and_starts_with_the_registry_down(own_registry: Registry, tmp_path: Path) -> None:
    template = Template(name="offline", base=f"{own_registry.host}/test/debian:bookworm", setup=["echo made > /made"])
    with backend(tmp_path / "store", own_registry) as online:
        first = online.build(template)
    own_registry.stop()
    with backend(tmp_path / "store", own_registry) as offline:  # a new process's view: nothing in memory
        again = offline.build(template)
        with offline.create(again) as sandbox:
            assert sandbox.read_file("/made") == b"made\n"
    assert again.id == first.id and again.digest == first.digest


def test_an_image_never_resolved_here_says_how_to_provide_it(own_registry: Registry, tmp_path: Path) -> None:
    """Unreachable and never seen: RegistryUnreachableError, naming the image, and both the Dockerfile's
    FROM and the prebuilt docker_image tried first, with the runner's command-line overrides."""
    own_registry.stop()
    prebuilt = f"{own_registry.host}/test/prebuilt:1"
    build = DockerBuild(
        dockerfile=textwrap.dedent(f"FROM {own_registry.host}/test/debian:bookworm\nRUN true\n"),
        context=str(tmp_path), prebuilt=prebuilt,
    )  # fmt: skip
    with backend(tmp_path / "store", own_registry) as offline, pytest.raises(RegistryUnreachableError) as raised:
        offline.build(Template(name="never", dockerfile=build))
    message = str(raised.value)
    assert f"image {own_registry.host}/test/debian:bookworm" in message
    assert f"prebuilt docker_image {prebuilt} could not be had either" in message
    assert "backend.registry.mirrors=" in message and "suite.images=" in message
