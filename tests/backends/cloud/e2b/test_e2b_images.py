"""Task images on E2B, through the real ``e2b`` SDK's template builder and the stand-in (which pulls
the image for real from a registry on 127.0.0.1): a sandbox of a registry image, its template built
once per image and size, a missing image, credentials and sizes on the wire."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from pool import ImageError, LocalBackend, Resources
from pool.backends.e2b.provider import E2BProvider
from pool.backends.remote.provider import CreateRequest, ProviderImage
from pool.build.registry.settings import RegistrySettings
from tests.backends.cloud.e2b.standin import E2BStandin
from tests.support.fixtures.oci_fixtures import DebianImages, Registry, missing_tools
from tests.support.needs import needs

pytest_plugins = ["tests.support.fixtures.oci_fixtures"]
pytestmark = needs(missing_tools(), f"needs {', '.join(missing_tools())}")


@pytest.fixture(scope="module")
def standin(registry: Registry, tmp_path_factory: pytest.TempPathFactory) -> Iterator[E2BStandin]:
    settings = RegistrySettings(insecure_registries=[registry.host])
    store = tmp_path_factory.mktemp("e2b-images")
    with LocalBackend(store_dir=store, registry=settings) as local, E2BStandin(local) as e2b:
        yield e2b


@pytest.fixture
def provider(standin: E2BStandin) -> E2BProvider:
    return E2BProvider({"api_key": standin.api_key, "api_url": standin.url, "sandbox_url": standin.url},
                       base_template="base", lifetime_s=600)  # fmt: skip


def create(provider: E2BProvider, image: ProviderImage, resources: Resources | None = None) -> object:
    request = CreateRequest(None, {"snapgym.test": "images"}, uuid.uuid4().hex, image=image, resources=resources)
    return provider.create(request)


def test_a_sandbox_of_a_registry_image_built_once_per_image_and_size(
    provider: E2BProvider, standin: E2BStandin, debian_images: DebianImages
) -> None:
    image = ProviderImage(debian_images.base, insecure=True)
    sized = Resources(cpus=1.5, memory_mb=1023, storage_mb=2048)
    first = create(provider, image, sized)
    try:
        seen = provider.run(first, "cat /etc/debian_version; test -e /usr/bin/pytest || echo no-host", cwd="/",
                            env={}, timeout_s=60, cap=4096)  # fmt: skip
        assert seen.stdout.startswith("12.") and "no-host" in seen.stdout
    finally:
        provider.kill(first)
    builds = [b for b in standin.control.templates.builds if b.image == debian_images.base]
    assert [(b.cpu_count, b.memory_mb, b.min_free_disk_mb, b.status) for b in builds] == [(2, 1024, 2048, "ready")]
    provider.kill(create(provider, image, sized))  # found by name: no second build
    assert len([b for b in standin.control.templates.builds if b.image == debian_images.base]) == 1
    provider.kill(create(provider, image))  # another size is another template
    assert len([b for b in standin.control.templates.builds if b.image == debian_images.base]) == 2


def test_a_missing_image_is_an_image_error_naming_it(provider: E2BProvider, registry: Registry) -> None:
    missing = f"{registry.host}/test/no-such-image:1"
    with pytest.raises(ImageError, match="test/no-such-image"):
        create(provider, ProviderImage(missing, insecure=True))


def test_credentials_reach_the_build_and_never_a_sandbox(
    provider: E2BProvider, standin: E2BStandin, debian_images: DebianImages
) -> None:
    image = ProviderImage(debian_images.sibling, username="alice", password="s3cret-pass", insecure=True)
    sandbox = create(provider, image)
    try:
        env = provider.run(sandbox, "env; cat /proc/1/environ 2>/dev/null", cwd="/", env={}, timeout_s=60, cap=1 << 16)
    finally:
        provider.kill(sandbox)
    (build,) = [b for b in standin.control.templates.builds if b.image == debian_images.sibling]
    assert build.registry_user == "alice"
    assert "s3cret-pass" not in env.stdout
