"""What a cloud backend does on the host for a task's image, against a real registry on 127.0.0.1:
the reference resolved to a pinned digest and config, credentials found for the provider, and
``COPY --from`` files read out of the image's layers (whiteouts applied) and unpacked by ``tar`` in
a real sandbox."""

from __future__ import annotations

import hashlib
import tarfile
from pathlib import Path

import pytest

from pool import LocalBackend, Snapshot
from pool.backends.remote.backend import provider_image
from pool.build.dockerfile import ImageCopy
from pool.build.registry.extract import image_files
from pool.build.registry.resolve import credentials_for, resolve_image
from pool.build.registry.settings import Credentials, RegistrySettings
from pool.build.registry.taskimages import TaskImages
from pool.errors import BuildError, ConfigError, ImageError
from tests.support.fixtures.oci_fixtures import (
    Entry,
    Layout,
    Registry,
    auth_file,
    missing_tools,
    new_image,
    push,
    write_tar,
)
from tests.support.needs import needs

pytest_plugins = ["tests.support.fixtures.oci_fixtures"]
pytestmark = needs(missing_tools(), f"needs {', '.join(missing_tools())}")


@pytest.fixture(scope="module")
def layered(registry: Registry, tmp_path_factory: pytest.TempPathFactory) -> str:
    """Two layers: the upper one deletes a file, hides a folder's old contents and keeps its own name."""
    folder = tmp_path_factory.mktemp("layered")
    lower = write_tar(folder / "lower.tar", [
        Entry("opt/", kind=tarfile.DIRTYPE, mode=0o755),
        Entry("opt/tool/", kind=tarfile.DIRTYPE, mode=0o755),
        Entry("opt/tool/old", b"old\n"),
        Entry("opt/tool/bin", b"#!/bin/sh\necho tool\n", mode=0o755),
        Entry("opt/gone", b"gone\n"),
        Entry("opt/.hidden", b"dot\n"),
    ])  # fmt: skip
    upper = write_tar(folder / "upper.tar", [
        Entry("opt/", kind=tarfile.DIRTYPE, mode=0o755),
        Entry("opt/keep", b"kept\n"),
        Entry("opt/.wh.keep"),  # after its own entry: a layer's whiteouts only hide what is below
        Entry("opt/.wh.gone"),
        Entry("opt/tool/", kind=tarfile.DIRTYPE, mode=0o755),
        Entry("opt/tool/.wh..wh..opq"),
        Entry("opt/tool/bin", b"#!/bin/sh\necho new tool\n", mode=0o750),
        Entry("opt/tool/link", kind=tarfile.SYMTYPE, link="bin"),
    ])  # fmt: skip
    layout = Layout(folder / "layout")
    new_image(layout, "1", [lower, upper], env={"PATH": "/opt/tool:/usr/bin", "LANG": "C.UTF-8"}, workdir="/opt")
    return push(layout.ref("1"), registry, "test/layered:1")


def settings(registry: Registry, **fields: object) -> RegistrySettings:
    return RegistrySettings(insecure_registries=[registry.host], **fields)  # type: ignore[arg-type]


def test_a_tag_is_resolved_to_a_pinned_digest_and_its_config(registry: Registry, layered: str) -> None:
    resolved = resolve_image(layered, settings(registry))
    assert (
        resolved.digest.startswith("sha256:")
        and resolved.reference == f"{registry.host}/test/layered@{resolved.digest}"
    )
    assert (
        resolved.config.env == {"PATH": "/opt/tool:/usr/bin", "LANG": "C.UTF-8"} and resolved.config.workdir == "/opt"
    )
    assert resolved.insecure and resolved.credentials is None
    assert resolve_image(resolved.reference, settings(registry)).digest == resolved.digest  # a pin resolves to itself


def test_what_cannot_be_resolved_says_why(registry: Registry, layered: str, tmp_path: Path) -> None:
    with pytest.raises(ImageError, match="test/absent"):
        resolve_image(f"{registry.host}/test/absent:1", settings(registry))
    wrong = "sha256:" + "0" * 64
    with pytest.raises(ImageError, match="pinned"):
        resolve_image(f"{layered}@{wrong}", settings(registry))
    with pytest.raises(ConfigError, match="push it"):
        resolve_image(f"oci:{tmp_path}:x", settings(registry))


def test_credentials_come_from_the_settings_or_their_auth_file(tmp_path: Path) -> None:
    given = RegistrySettings(credentials={"reg.example:5000": Credentials("alice", "s3cret")})
    assert credentials_for(given, "reg.example:5000") == Credentials("alice", "s3cret")
    assert credentials_for(given, "other.example") is None
    from_file = RegistrySettings(auth_file=auth_file(tmp_path / "auth.json", "reg.example:5000", "bob", "pa:ss"))
    assert credentials_for(from_file, "reg.example:5000") == Credentials("bob", "pa:ss")


def test_files_are_read_out_of_the_layers_with_whiteouts_applied(registry: Registry, layered: str) -> None:
    resolved = resolve_image(layered, settings(registry))
    entries, found = image_files(resolved.reference, resolved.digest, ["/opt"], settings(registry))
    assert sorted(entries) == ["/opt", "/opt/.hidden", "/opt/keep", "/opt/tool", "/opt/tool/bin", "/opt/tool/link"]
    assert entries["/opt/tool/bin"][1] == b"#!/bin/sh\necho new tool\n" and entries["/opt/tool/bin"][0].mode == 0o750
    assert found[0].is_dir
    with pytest.raises(BuildError, match="/opt/nothing is not in the image"):
        image_files(resolved.reference, resolved.digest, ["/opt/nothing"], settings(registry))


def test_copy_from_an_image_lands_in_a_real_sandbox_as_docker_places_it(
    registry: Registry, layered: str, backend: LocalBackend, snap: Snapshot
) -> None:
    images = TaskImages(settings(registry), backend="test")
    with backend.create(snap) as sandbox:
        sandbox.exec("mkdir -p /srv/into")
        images.copy_from_image(sandbox, ImageCopy(layered, ("/opt/tool",), "/srv/tool", into_dir=False))
        images.copy_from_image(sandbox, ImageCopy(layered, ("/opt/tool/bin",), "/srv/into", into_dir=False))
        images.copy_from_image(sandbox, ImageCopy(layered, ("/opt/keep",), "/srv/renamed", into_dir=False, mode=0o600))
        listing = sandbox.exec("cd / && stat -c '%n %a' srv/tool/bin srv/into/bin srv/renamed && "
                               "readlink srv/tool/link && srv/tool/link && ls -A /tmp").stdout  # fmt: skip
    assert listing.splitlines() == [
        "srv/tool/bin 750", "srv/into/bin 750", "srv/renamed 600", "bin", "new tool",
    ]  # fmt: skip


def test_the_identity_is_the_digests(registry: Registry, layered: str) -> None:
    images = TaskImages(settings(registry), backend="test")
    digest = resolve_image(layered, settings(registry)).digest
    assert images.identity(layered, ()) == f"image:{digest}"
    assert images.can_get(layered) and not images.can_get(f"{registry.host}/test/absent:1")
    image = provider_image(images, layered)
    assert image.digest == digest and image.key == hashlib.sha256(digest.encode()).hexdigest()[:24] and image.insecure
