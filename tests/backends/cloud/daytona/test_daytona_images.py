"""Task images and resources on Daytona: the real ``daytona`` SDK creates sandboxes from registry images
(``CreateSandboxFromImageParams``) against the stand-in (tests/backends/cloud/daytona/standin.py), which
builds them from a Debian image in a local registry (tests/support/fixtures/oci_fixtures.py): the sandbox runs on
the image's files, a second create reuses the build, a missing image is an ImageError, credentials are
refused before anything is sent, resources reach the wire and stay with the snapshot, and
``DaytonaBackend.build`` of a template from the image runs end to end."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.needs import import_or_skip, needs

import_or_skip("daytona", "the daytona SDK (0.226) is not installed")

import daytona  # noqa: E402

from pool import LocalBackend, Template  # noqa: E402
from pool.backends.daytona import DaytonaBackend  # noqa: E402
from pool.backends.daytona.images import sdk_resources  # noqa: E402
from pool.backends.daytona.provider import DaytonaProvider  # noqa: E402
from pool.backends.remote.provider import CreateRequest, ProviderImage  # noqa: E402
from pool.build.registry.settings import RegistrySettings  # noqa: E402
from pool.errors import ConfigError, ImageError, ProviderBusyError  # noqa: E402
from pool.resources import Resources  # noqa: E402
from tests.backends.cloud.daytona.builds import build_ref  # noqa: E402
from tests.backends.cloud.daytona.standin import DaytonaStandin  # noqa: E402
from tests.support.fixtures.oci_fixtures import DebianImages, Registry, missing_tools  # noqa: E402

pytest_plugins = ["tests.support.fixtures.oci_fixtures"]

RESOURCES = Resources(cpus=1.5, memory_mb=1536, storage_mb=4096)
"""Rounded up on the wire to 2 cores, 2 GiB of memory, 4 GiB of disk."""


@pytest.fixture(scope="module")
def registry_backend(registry: Registry, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalBackend]:
    """The stand-in's local backend, reaching the test registry (plain HTTP); one store for the module, so
    the Debian layer is fetched once."""
    settings = RegistrySettings(insecure_registries=[registry.host])
    with LocalBackend(store_dir=tmp_path_factory.mktemp("daytona-images"), registry=settings) as backend:
        yield backend


@pytest.fixture
def standin(registry_backend: LocalBackend) -> Iterator[DaytonaStandin]:
    with DaytonaStandin(registry_backend) as standin:
        yield standin


@pytest.fixture
def provider(standin: DaytonaStandin) -> Iterator[DaytonaProvider]:
    made = DaytonaProvider(standin.sdk_config(), base_snapshot=None, lifetime_s=600, request_timeout_s=30)
    yield made
    made.close()


def request(image: ProviderImage, resources: Resources | None = None) -> CreateRequest:
    return CreateRequest(None, {"snapgym.owner": "t"}, uuid.uuid4().hex, resources=resources, image=image)


def run(provider: DaytonaProvider, remote: Any, command: str) -> str:
    result = provider.run(remote, command, cwd="/", env={}, timeout_s=60, cap=1 << 16)
    assert result.exit_code == 0, result
    return result.stdout


def creates(standin: DaytonaStandin) -> list[dict[str, Any]]:
    return [record.request for record in standin.sandboxes().values()]


pytestmark = needs(missing_tools(), f"needs {', '.join(missing_tools())}")


def test_a_sandbox_from_an_image_runs_on_its_files(
    standin: DaytonaStandin, provider: DaytonaProvider, debian_images: DebianImages
) -> None:
    """The SDK sends the image as a one-line Dockerfile; the sandbox sees the image's files, not the host's."""
    remote = provider.create(request(ProviderImage(debian_images.sibling, insecure=True)))
    assert run(provider, remote, "cat /etc/debian_version").startswith("12.")
    assert run(provider, remote, "cat /opt/sibling; test ! -e /home/daytona && echo image-root") == (
        "sibling\nimage-root\n"
    )
    (body,) = creates(standin)
    assert body["buildInfo"] == {"dockerfileContent": f"FROM {debian_images.sibling}\n"} and "snapshot" not in body
    (build,) = standin.builds().values()
    assert build.image == debian_images.sibling and build.state == "ready"


def test_a_second_create_of_the_image_reuses_its_build(
    standin: DaytonaStandin, provider: DaytonaProvider, debian_images: DebianImages
) -> None:
    image = ProviderImage(debian_images.base, insecure=True)
    first = provider.create(request(image))
    second = provider.create(request(image))
    assert provider.sandbox_id(first) != provider.sandbox_id(second)
    assert list(standin.builds()) == [build_ref(f"FROM {debian_images.base}\n")]  # one build, by Dockerfile hash
    assert run(provider, second, "cat /etc/debian_version").startswith("12.")
    refs = {record.build_ref for record in standin.sandboxes().values()}
    assert refs == set(standin.builds())


def test_a_missing_image_is_an_image_error_naming_it(
    standin: DaytonaStandin, provider: DaytonaProvider, registry: Registry
) -> None:
    """The build fails as Daytona's does (``build_failed`` with a reason); the failed sandbox is deleted."""
    missing = f"{registry.host}/test/nope:1"
    with pytest.raises(ImageError) as raised:
        provider.create(request(ProviderImage(missing, insecure=True)))
    assert missing in str(raised.value) and "registr" in str(raised.value)
    (record,) = standin.sandboxes().values()
    assert record.error_reason and record.state == "destroyed" and record.ended_by == "api"
    (build,) = standin.builds().values()
    assert build.state == "error" and "test/nope" in (build.error_reason or "")


def test_registry_credentials_are_refused_before_anything_is_sent(
    standin: DaytonaStandin, provider: DaytonaProvider, debian_images: DebianImages
) -> None:
    """Daytona takes registries per organisation: a credentialed image says where to add the registry."""
    image = ProviderImage(debian_images.base, username="alice", password="s3cret-token", insecure=True)
    with pytest.raises(ConfigError) as raised:
        provider.create(request(image))
    message = str(raised.value)
    assert "dashboard/registries" in message and debian_images.base.split("/")[0] in message
    assert "s3cret-token" not in message and "s3cret-token" not in repr(image)
    assert not [r for r in standin.requests if r.method == "POST"] and not standin.sandboxes()


def test_resources_reach_the_wire_rounded_up_and_stay_with_the_snapshot(
    standin: DaytonaStandin, provider: DaytonaProvider, debian_images: DebianImages
) -> None:
    """The build sandbox gets the resources; its snapshot keeps them; a sandbox from the snapshot has them."""
    builder = provider.create(request(ProviderImage(debian_images.base, insecure=True), RESOURCES))
    (body,) = creates(standin)
    assert (body["cpu"], body["memory"], body["disk"]) == (2, 2, 4) and "gpu" not in body
    wanted = {"cpu": 2, "gpu": 0, "memory": 2, "disk": 4}
    assert standin.sandboxes()[provider.sandbox_id(builder)].resources == wanted
    name = provider.make_snapshot(builder, f"sg-images-{uuid.uuid4().hex[:8]}")
    assert standin.snapshots()[name].resources == wanted
    episode = provider.create(CreateRequest(name, {}, uuid.uuid4().hex, resources=RESOURCES))
    record = standin.sandboxes()[provider.sandbox_id(episode)]
    assert record.resources == wanted and "cpu" not in record.request  # the snapshot's: a snapshot create sends none
    assert run(provider, episode, "cat /etc/debian_version").startswith("12.")


def test_the_sdk_streams_the_build_log_while_the_sandbox_waits(
    standin: DaytonaStandin, debian_images: DebianImages
) -> None:
    """``on_snapshot_create_logs``: the SDK reads ``build-logs-url`` and follows the log to the end."""
    client = daytona.Daytona(standin.sdk_config())
    lines: list[str] = []
    params = daytona.CreateSandboxFromImageParams(image=debian_images.sibling, resources=daytona.Resources(cpu=3))
    sandbox = client.create(params, timeout=120, on_snapshot_create_logs=lines.append)
    assert sandbox.state == "started" and sandbox.cpu == 3 and sandbox.build_info is not None
    assert any(f"FROM {debian_images.sibling}" in line for line in lines) and "Successfully built" in lines[-1]
    paths = [r.path for r in standin.requests if r.method == "GET"]
    assert f"/sandbox/{sandbox.id}/build-logs-url" in paths and f"/sandbox/{sandbox.id}/build-logs" in paths
    client.delete(sandbox)


def test_sdk_resources_round_up_to_daytona_units() -> None:
    made = sdk_resources(Resources(cpus=0.5, memory_mb=1025, storage_mb=2048, gpus=1, gpu_types=("h100", "B200")))
    assert (made.cpu, made.memory, made.disk, made.gpu) == (1, 2, 2, 1)
    assert made.gpu_type == [daytona.GpuType.H100, daytona.GpuType.B200]
    assert sdk_resources(None) is None and sdk_resources(Resources()) is None
    with pytest.raises(ConfigError, match=r"no GPU type 'T4'.*H100"):
        sdk_resources(Resources(gpus=1, gpu_types=("T4",)))


def test_a_template_from_the_image_builds_on_the_backend_and_its_episodes_get_its_resources(
    standin: DaytonaStandin, debian_images: DebianImages, registry: Registry
) -> None:
    """End to end: DaytonaBackend.build resolves the image on the host, the build sandbox starts from it
    (pinned by digest) with the template's resources, and every episode starts from the snapshot with them."""
    options = {"api_key": standin.api_key, "api_url": standin.url, "target": "us"}
    registry_options = {"insecure_registries": [registry.host]}
    template = Template(
        name="daytona-image", base=debian_images.base, setup=["echo built > /built"], resources=RESOURCES
    )
    with DaytonaBackend(**options, registry=registry_options) as backend:  # type: ignore[arg-type]
        snapshot = backend.build(template)
        assert snapshot.unapplied == ()
        with backend.create(snapshot) as sandbox:
            seen = sandbox.exec("cat /built /etc/debian_version")
            assert seen.ok and seen.stdout.startswith("built\n12."), seen
            record = standin.sandboxes()[str(sandbox.remote_id)]
            assert (record.resources["cpu"], record.resources["memory"], record.resources["disk"]) == (2, 2, 4)
    (build,) = standin.builds().values()
    assert build.image is not None and "@sha256:" in build.image  # the digest resolved on the host
    created = standin.created_count
    with DaytonaBackend(**options, registry=registry_options) as again:  # type: ignore[arg-type]
        assert again.build(template).layers == snapshot.layers  # found by name: nothing built
    assert len(standin.builds()) == 1 and standin.created_count == created


def test_a_retried_create_whose_answer_was_lost_waits_for_the_build(
    standin: DaytonaStandin, provider: DaytonaProvider, debian_images: DebianImages
) -> None:
    """The retry (same idempotency key, so the same name) meets the name taken and takes that sandbox once
    its image is built."""
    asked = request(ProviderImage(debian_images.whiteouts, insecure=True))
    standin.fail_next("POST", "/sandbox", 503, after=True)
    with pytest.raises(ProviderBusyError):
        provider.create(asked)
    remote = provider.create(asked)
    assert run(provider, remote, "cat /etc/debian_version").startswith("12.")
    assert len(standin.sandboxes()) == 1 and len(standin.builds()) == 1
