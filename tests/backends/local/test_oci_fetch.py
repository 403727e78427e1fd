"""Fetching images with skopeo from real local registries: tags, pins, damage, credentials, mirrors, files."""

from __future__ import annotations

import json
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

from pool.backends.local.oci.fetch import ImageFetcher
from pool.build.registry.settings import Credentials, RegistrySettings
from pool.errors import ConfigError, ImageError
from tests.support.fixtures.oci_fixtures import (
    PASSWORD,
    USER,
    Registry,
    auth_file,
    free_port,
    missing_tools,
    push,
    tiny_image,
)
from tests.support.needs import needs, skip_missing

pytest_plugins = ["tests.support.fixtures.oci_fixtures"]

pytestmark = needs(missing_tools(), f"needs {', '.join(missing_tools())}")


def plain(*registries: Registry, **options: object) -> RegistrySettings:
    """Settings that reach these plain-HTTP test registries."""
    return RegistrySettings(insecure_registries=[r.host for r in registries], **options)  # type: ignore[arg-type]


def pushed_tiny(tmp_path: Path, registry: Registry, *, authfile: Path | None = None) -> tuple[str, str, list[str]]:
    """A fresh one-layer image (blobs of its own) in ``registry``: (reference, manifest digest, layer digests)."""
    name = uuid.uuid4().hex[:12]
    layout = tiny_image(tmp_path, name)
    ref = push(layout.ref("latest"), registry, f"tiny/{name}:1", authfile=authfile)
    return ref, layout.manifest_digest("latest"), layout.layer_digests("latest")


def test_fetch_by_tag_and_by_digest(tmp_path: Path, registry: Registry) -> None:
    ref, manifest, layers = pushed_tiny(tmp_path, registry)
    fetcher = ImageFetcher(tmp_path / "cache", settings=plain(registry))
    image = fetcher.fetch(ref)
    assert image.resolved_digest == image.manifest_digest == manifest
    assert [layer.digest for layer in image.layers] == layers
    assert all(layer.path.is_file() and layer.diff_id.startswith("sha256:") for layer in image.layers)
    assert image.config.env["TINY"] == ref.rsplit("/", 1)[1].split(":")[0]
    assert image.config.workdir == "/data"

    repo = ref.rsplit(":", 1)[0]
    pinned = fetcher.fetch(f"docker://{repo}@{manifest}")
    assert pinned.manifest_digest == manifest and pinned.layers == image.layers  # blobs stored once
    assert fetcher.resolve(ref) == manifest
    # a pin resolves without the network: this host does not exist
    assert fetcher.resolve(f"127.0.0.1:{free_port()}/no/such@{manifest}") == manifest


def test_docker_schema_2_image(tmp_path: Path, registry: Registry) -> None:
    layout = tiny_image(tmp_path, "schema2")
    ref = push(layout.ref("latest"), registry, "tiny/schema2:1", fmt="v2s2")
    fetcher = ImageFetcher(tmp_path / "cache", settings=plain(registry))
    image = fetcher.fetch(ref)
    assert image.resolved_digest != layout.manifest_digest("latest")  # the registry holds another manifest
    assert [layer.digest for layer in image.layers] == layout.layer_digests("latest")
    assert image.config.env["TINY"] == "schema2" and image.config.workdir == "/data"


def test_wrong_pin_is_refused(tmp_path: Path, registry: Registry) -> None:
    ref, manifest, _ = pushed_tiny(tmp_path, registry)
    wrong = "sha256:" + ("0" if manifest[-1] != "0" else "1") * 64
    fetcher = ImageFetcher(tmp_path / "cache", settings=plain(registry))
    with pytest.raises(ImageError, match=r"was not found.*pinned digest") as err:
        fetcher.fetch(f"{ref.rsplit(':', 1)[0]}@{wrong}")
    assert wrong in str(err.value) and "docker-archive:" in str(err.value)


def test_blob_damaged_in_the_registry_is_refused(tmp_path: Path, registry: Registry) -> None:
    ref, _, layers = pushed_tiny(tmp_path, registry)
    blob = registry.blob_file(layers[0])
    blob.write_bytes(blob.read_bytes()[:-10] + b"0123456789")
    fetcher = ImageFetcher(tmp_path / "cache", settings=plain(registry))
    with pytest.raises(ImageError, match="differs from its digest") as err:
        fetcher.fetch(ref)
    assert layers[0] in str(err.value) and "push the image" in str(err.value)


def test_blob_damaged_in_the_cache_is_fetched_again(tmp_path: Path, registry: Registry) -> None:
    ref, _, layers = pushed_tiny(tmp_path, registry)
    fetcher = ImageFetcher(tmp_path / "cache", settings=plain(registry))
    cached = fetcher.fetch(ref).layers[0].path
    good = cached.read_bytes()
    cached.chmod(0o644)
    cached.write_bytes(good[:-1] + bytes([good[-1] ^ 1]))
    assert fetcher.fetch(ref).layers[0].path.read_bytes() == good  # fetched again, whole

    cached.chmod(0o644)
    cached.write_bytes(b"damaged")
    registry.blob_file(layers[0]).write_bytes(b"damaged too")  # and the source cannot repair it
    with pytest.raises(ImageError, match="differs from its digest") as err:
        fetcher.fetch(ref)
    assert layers[0] in str(err.value)


def test_credentials_refused_without_and_accepted_with(tmp_path: Path, auth_registry: Registry) -> None:
    host, ca = auth_registry.host, auth_registry.ca_dir
    assert ca is not None
    ref, manifest, _ = pushed_tiny(
        tmp_path, auth_registry, authfile=auth_file(tmp_path / "push-auth.json", host, USER, PASSWORD)
    )
    cache = tmp_path / "cache"

    with pytest.raises(ImageError, match=r"certificate of .* is not trusted.*ca_dirs"):
        ImageFetcher(cache, settings=RegistrySettings()).fetch(ref)
    with pytest.raises(ImageError, match=r"refused access.*credentials="):
        ImageFetcher(cache, settings=RegistrySettings(ca_dirs=[ca])).fetch(ref)
    wrong = RegistrySettings(ca_dirs=[ca], credentials={host: Credentials(USER, "wrong-password")})
    with pytest.raises(ImageError, match="refused access") as err:
        ImageFetcher(cache, settings=wrong).fetch(ref)
    assert "wrong-password" not in str(err.value) and "wrong-password" not in repr(wrong)

    good = RegistrySettings(ca_dirs=[ca], credentials={host: Credentials(USER, PASSWORD)})
    assert ImageFetcher(cache, settings=good).fetch(ref).manifest_digest == manifest
    from_file = RegistrySettings(ca_dirs=[ca], auth_file=auth_file(tmp_path / "config.json", host, USER, PASSWORD))
    assert ImageFetcher(tmp_path / "cache2", settings=from_file).fetch(ref).manifest_digest == manifest


def test_fetch_through_a_mirror_when_the_registry_is_down(
    tmp_path: Path, registry: Registry, mirror_registry: Registry
) -> None:
    name = uuid.uuid4().hex[:12]
    layout = tiny_image(tmp_path, name)
    push(layout.ref("latest"), mirror_registry, f"team/{name}:1")
    down = f"127.0.0.1:{free_port()}"  # the configured registry: nothing listens there
    ref = f"{down}/team/{name}:1"

    with pytest.raises(ImageError, match=r"cannot be reached.*mirrors="):
        ImageFetcher(tmp_path / "cache", settings=RegistrySettings(insecure_registries=[down])).fetch(ref)
    settings = RegistrySettings(
        mirrors={down: [mirror_registry.host]}, insecure_registries=[down, mirror_registry.host]
    )
    image = ImageFetcher(tmp_path / "cache", settings=settings).fetch(ref)
    assert image.manifest_digest == layout.manifest_digest("latest")
    assert image.config.env["TINY"] == name


def test_local_sources_oci_layout_and_docker_archive(tmp_path: Path) -> None:
    layout = tiny_image(tmp_path, "files")
    fetcher = ImageFetcher(tmp_path / "cache")
    from_layout = fetcher.fetch(layout.ref("latest"))
    assert from_layout.resolved_digest == layout.manifest_digest("latest") == fetcher.resolve(layout.ref("latest"))

    archive = tmp_path / "saved.tar"  # what `docker save` writes
    subprocess.run(
        ["skopeo", "--insecure-policy", "copy", "--quiet", layout.ref("latest"), f"docker-archive:{archive}:tiny:1"],
        check=True,
    )
    from_archive = fetcher.fetch(f"docker-archive:{archive}")
    assert fetcher.resolve(f"docker-archive:{archive}") is None
    assert [layer.diff_id for layer in from_archive.layers] == [layer.diff_id for layer in from_layout.layers]
    assert from_archive.config == from_layout.config


@pytest.mark.docker
def test_docker_daemon_source(tmp_path: Path) -> None:
    if shutil.which("docker") is None or subprocess.run(["docker", "info"], capture_output=True).returncode != 0:
        skip_missing("no Docker engine reachable")
    layout = tiny_image(tmp_path, "daemon")
    name = f"snapgym-oci-test:{uuid.uuid4().hex[:12]}"
    subprocess.run(["skopeo", "--insecure-policy", "copy", "--quiet", layout.ref("latest"), f"docker-daemon:{name}"],
                   check=True)  # fmt: skip
    try:
        image = ImageFetcher(tmp_path / "cache").fetch(f"docker-daemon:{name}")
        assert image.config.env["TINY"] == "daemon"
    finally:
        subprocess.run(["docker", "image", "rm", "-f", name], capture_output=True)


def test_errors_name_the_image_and_how_to_provide_it(tmp_path: Path, registry: Registry) -> None:
    fetcher = ImageFetcher(tmp_path / "cache", settings=plain(registry))
    with pytest.raises(ImageError, match="was not found") as err:
        fetcher.fetch(f"{registry.host}/no/such:tag")
    assert f"{registry.host}/no/such:tag" in str(err.value) and "docker save" in str(err.value)
    with pytest.raises(ImageError, match="was not found"):
        fetcher.fetch(f"docker-archive:{tmp_path}/missing.tar")
    with pytest.raises(ImageError, match=r"plain HTTP.*insecure_registries"):
        ImageFetcher(tmp_path / "cache").fetch(f"{registry.host}/no/such:tag")
    with pytest.raises(ConfigError, match="not a valid image reference"):
        fetcher.fetch("Not An Image")


def test_image_for_another_platform_is_refused(tmp_path: Path, registry: Registry) -> None:
    layout = tiny_image(tmp_path, "arm", arch="arm64")
    ref = push(layout.ref("latest"), registry, "tiny/arm:1")
    with pytest.raises(ImageError, match="made for linux/arm64, not linux/amd64"):
        ImageFetcher(tmp_path / "cache", settings=plain(registry, platform="linux/amd64")).fetch(ref)
    image = ImageFetcher(tmp_path / "cache", settings=plain(registry, platform="linux/arm64")).fetch(ref)
    assert image.platform == "linux/arm64"


def test_settings_are_checked() -> None:
    with pytest.raises(ConfigError, match="not a registry host"):
        RegistrySettings(insecure_registries=["https://example.com/v2"])
    with pytest.raises(ConfigError, match="list of hosts"):
        RegistrySettings(mirrors={"docker.io": "mirror.example.com"})
    with pytest.raises(ConfigError, match="os/arch"):
        RegistrySettings(platform="amd64")
    hub = RegistrySettings(credentials={"index.docker.io": Credentials("u", "p")})
    assert list(hub.credentials) == ["docker.io"]
    assert "secret-p" not in repr(Credentials("u", "secret-p"))


def test_two_processes_fetch_into_one_cache_at_once(tmp_path: Path, registry: Registry) -> None:
    ref, manifest, _ = pushed_tiny(tmp_path, registry)
    script = (
        "import sys; from pool.backends.local.oci.fetch import ImageFetcher; "
        "from pool.build.registry.settings import RegistrySettings; "
        f"print(ImageFetcher(sys.argv[1], settings=RegistrySettings(insecure_registries=[{registry.host!r}]))"
        ".fetch(sys.argv[2]).manifest_digest)"
    )
    procs = [
        subprocess.Popen(["python", "-c", script, str(tmp_path / "cache"), ref], stdout=subprocess.PIPE, text=True)
        for _ in range(3)
    ]
    outputs = [p.communicate(timeout=60)[0].strip() for p in procs]
    assert outputs == [manifest] * 3
    index = json.loads((tmp_path / "cache" / "layout" / "index.json").read_text())
    assert len(index["manifests"]) == 1
