"""OCI images as local-backend bases: store layers in overlayfs format, shared, cached, and seen by sandboxes.

The images are built from Debian packages (see ``oci_fixtures``) and served by a
real registry on 127.0.0.1. Most sandboxes start from a Snapshot made straight from
the image's base record; one test builds a Template over an image, as users do.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from pool import LocalBackend, Snapshot, Template
from pool.backends.local.oci.fetch import ImageFetcher
from pool.backends.local.oci.imagebase import SEED, image_base
from pool.backends.local.store.catalogue import BaseRecord, SnapshotStore
from pool.build.digest import combine
from pool.build.registry.settings import RegistrySettings
from pool.errors import ConfigError, ImageError, SnapshotCorruptError
from tests.support.fixtures.oci_fixtures import DebianImages, Registry, free_port, missing_tools, push, tiny_image
from tests.support.needs import needs, skip_missing

pytest_plugins = ["tests.support.fixtures.oci_fixtures"]

pytestmark = needs(missing_tools(), f"needs {', '.join(missing_tools())}")

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def oci_backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalBackend]:
    """A local backend over a store of this module's own."""
    store = tmp_path_factory.mktemp("oci-store")
    with LocalBackend(store_dir=store, memory_limit_mb=256, pids_limit=128, disk_limit_mb=64) as backend:
        yield backend


@pytest.fixture(scope="module")
def fetcher(tmp_path_factory: pytest.TempPathFactory, registry: Registry) -> ImageFetcher:
    return ImageFetcher(
        tmp_path_factory.mktemp("oci-cache"), settings=RegistrySettings(insecure_registries=[registry.host])
    )


def start_snapshot(record: BaseRecord, image: str, env: dict[str, str], workdir: str | None) -> Snapshot:
    """What LocalBackend.build starts a template's setup from, made straight from a base record."""
    return Snapshot(
        id=f"oci-test-{uuid.uuid4().hex[:12]}",
        digest=record.digest,
        backend="local",
        layers=record.layers,
        base=image,
        env=env,
        workdir=workdir or "/",
    )


def test_layers_are_in_overlay_format(
    oci_backend: LocalBackend, fetcher: ImageFetcher, debian_images: DebianImages
) -> None:
    store = oci_backend.store
    record, config = image_base(store, debian_images.whiteouts, fetcher=fetcher)
    assert len(record.layers) == 3  # Debian, the whiteout layer, the mount points
    assert record.seed == SEED
    assert record.digest == combine(SEED, *(store.layers.verify(layer) for layer in record.layers))
    assert config.env["SNAPGYM_IMAGE"] == "debian" and config.workdir == "/srv"

    top = store.layers.path(record.layers[1])
    issue = os.lstat(top / "etc/issue")
    assert stat.S_ISCHR(issue.st_mode) and issue.st_rdev == 0
    assert os.getxattr(top / "usr/share/doc", "trusted.overlay.opaque") == b"y"
    a, b = os.lstat(top / "srv/hard-a"), os.lstat(top / "srv/hard-b")
    assert a.st_ino == b.st_ino
    assert a.st_uid == oci_backend.id_offset + 1000  # numeric owners, shifted
    assert stat.S_IMODE(os.lstat(top / "srv/suid").st_mode) == 0o4755  # kept through the shift
    assert not (top / "srv/null").exists()

    debian = store.layers.path(record.layers[0])
    assert (debian / "etc/debian_version").read_text().startswith("12")
    mounts = store.layers.path(record.layers[2])
    assert sorted(os.listdir(mounts)) == ["dev", "etc", "proc", "root", "tmp"]
    assert stat.S_IMODE(os.lstat(mounts / "root").st_mode) == stat.S_IMODE(os.lstat(debian / "root").st_mode) == 0o700
    assert stat.S_IMODE(os.lstat(mounts / "tmp").st_mode) == 0o1777


def test_a_sandbox_sees_the_image_with_its_deletions(
    oci_backend: LocalBackend, fetcher: ImageFetcher, debian_images: DebianImages
) -> None:
    record, config = image_base(oci_backend.store, debian_images.whiteouts, fetcher=fetcher)
    snap = start_snapshot(record, debian_images.whiteouts, dict(config.env), config.workdir)
    with oci_backend.create(snap) as sandbox:
        r = sandbox.exec(
            "cat /etc/debian_version /etc/snapgym-release; test -e /etc/issue || echo issue-deleted; "
            "ls /usr/share/doc; cat /srv/keep; stat -c '%u %a' /srv/hard-a /root /tmp; pwd; echo $SNAPGYM_IMAGE"
        )
        assert r.ok, r.stderr
        lines = r.stdout.splitlines()
        assert lines[0].startswith("12") and lines[1:] == [
            "whiteouts",
            "issue-deleted",
            "snapgym",  # the opaque folder hides Debian's docs
            "kept",
            "1000 644",
            "0 700",
            "0 1777",
            "/srv",
            "debian",
        ]
        assert sandbox.exec("echo changed > /etc/snapgym-release && rm /etc/debian_version").ok
        sandbox.restore()
        assert sandbox.read_file("/etc/snapgym-release") == b"whiteouts\n"
        assert sandbox.exec("test -f /etc/debian_version").ok


def test_images_share_their_common_layer(
    oci_backend: LocalBackend, fetcher: ImageFetcher, debian_images: DebianImages
) -> None:
    store = oci_backend.store
    base, _ = image_base(store, debian_images.base, fetcher=fetcher)
    records = store.root / "oci" / "layers"
    debian_record = records / (fetcher.fetch(debian_images.base).layers[0].diff_id.removeprefix("sha256:") + ".json")
    before = {p.name: os.stat(p).st_ino for p in records.iterdir()}
    assert debian_record.name in before
    sibling, _ = image_base(store, debian_images.sibling, fetcher=fetcher)
    whiteouts, _ = image_base(store, debian_images.whiteouts, fetcher=fetcher)
    assert base.layers[0] == sibling.layers[0] == whiteouts.layers[0]
    assert base.layers[-1] == sibling.layers[-1]  # alike mount-point layers are one layer too
    after = {p.name: os.stat(p).st_ino for p in records.iterdir()}
    assert all(after[name] == ino for name, ino in before.items())  # the shared layer was not unpacked again
    own = fetcher.fetch(debian_images.sibling).layers[1].diff_id.removeprefix("sha256:")
    assert f"{own}.json" in after  # the sibling's own layer is recorded beside the shared one


def test_a_pinned_image_is_found_without_the_network(
    oci_backend: LocalBackend, tmp_path: Path, fetcher: ImageFetcher, debian_images: DebianImages
) -> None:
    digest = fetcher.resolve(debian_images.base)
    assert digest is not None
    repo = debian_images.base.rsplit(":", 1)[0]
    record, config = image_base(oci_backend.store, f"{repo}@{digest}", fetcher=fetcher)
    # The same pin on a host that is down, with an empty fetch cache: served from the store alone.
    offline = ImageFetcher(tmp_path / "empty-cache", settings=RegistrySettings())
    again, config_again = image_base(
        oci_backend.store, f"127.0.0.1:{free_port()}/test/debian@{digest}", fetcher=offline
    )
    assert (again, config_again) == (record, config)
    assert not (tmp_path / "empty-cache" / "layout").exists()
    # A tag costs one manifest request and no copy.
    shutil.rmtree(fetcher.layout)
    assert image_base(oci_backend.store, debian_images.base, fetcher=fetcher)[0] == record
    assert not fetcher.layout.exists()


def test_the_digest_depends_on_the_files_only(tmp_path: Path, registry: Registry) -> None:
    layout = tiny_image(tmp_path, f"digest-{uuid.uuid4().hex[:8]}")
    ref = push(layout.ref("latest"), registry, "tiny/digest:1")  # gzip-compressed layer blobs
    archive = tmp_path / "saved.tar"  # uncompressed layer blobs, another manifest
    subprocess.run(["skopeo", "--insecure-policy", "copy", "--quiet", layout.ref("latest"),
                    f"docker-archive:{archive}:tiny:1"], check=True)  # fmt: skip
    settings = RegistrySettings(insecure_registries=[registry.host])
    one = SnapshotStore(tmp_path / "store-a", id_offset=100000, rootless=False)
    two = SnapshotStore(tmp_path / "store-b", id_offset=200000, rootless=False)
    from_registry, _ = image_base(one, ref, fetcher=ImageFetcher(tmp_path / "cache-a", settings=settings))
    from_archive, _ = image_base(two, f"docker-archive:{archive}", fetcher=ImageFetcher(tmp_path / "cache-b"))
    assert from_registry.digest == from_archive.digest
    assert from_registry.layers == from_archive.layers  # same content, same layer ids

    # A layer changed in the store is caught before use (by the next process: this one checked it already).
    (one.layers.path(from_registry.layers[0]) / "etc" / "tiny-release").write_text("changed\n")
    later = SnapshotStore(tmp_path / "store-a", id_offset=100000, rootless=False)
    with pytest.raises(SnapshotCorruptError, match="tiny-release"):
        image_base(later, ref, fetcher=ImageFetcher(tmp_path / "cache-a", settings=settings))


def test_errors_reach_the_caller(oci_backend: LocalBackend, fetcher: ImageFetcher, registry: Registry) -> None:
    with pytest.raises(ImageError, match="was not found"):
        image_base(oci_backend.store, f"{registry.host}/no/such:image", fetcher=fetcher)
    with pytest.raises(ConfigError, match="not a valid image reference"):
        image_base(oci_backend.store, "No Such Image", fetcher=fetcher)


ROOTLESS_SCRIPT = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, {root!r})
    from pool import LocalBackend, Snapshot
    from pool.backends.local.oci.imagebase import image_base
    from pool.backends.local.oci.fetch import ImageFetcher
    from pool.build.registry.settings import RegistrySettings
    with LocalBackend(store_dir={store!r}, memory_limit_mb=256, disk_limit_mb=64) as backend:
        assert backend.rootless
        fetcher = ImageFetcher({cache!r}, settings=RegistrySettings(insecure_registries=[{host!r}]))
        record, config = image_base(backend.store, {image!r}, fetcher=fetcher)
        snap = Snapshot(id="rootless-oci", digest=record.digest, backend="local", layers=record.layers,
                        base={image!r}, env=dict(config.env), workdir="/")
        with backend.create(snap) as sbx:
            print(sbx.exec("test -e /etc/issue || echo issue-deleted; ls /usr/share/doc; cat /srv/keep").stdout)
    """
)


@needs(os.geteuid() != 0, "needs root to switch to an unprivileged user")
def test_rootless_sandbox_sees_whiteouts(debian_images: DebianImages) -> None:
    if shutil.which("setpriv") is None:
        skip_missing("setpriv (util-linux) is not installed")
    home = Path(tempfile.mkdtemp(prefix="snapgym-oci-rootless-"))  # pytest's tmp_path is root's alone
    try:
        home.chmod(0o777)
        script = ROOTLESS_SCRIPT.format(
            root=str(ROOT),
            store=str(home / "store"),
            cache=str(home / "cache"),
            host=debian_images.whiteouts.split("/")[0],
            image=debian_images.whiteouts,
        )
        done = subprocess.run(
            ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c", script],
            capture_output=True,
            text=True,
            timeout=120,
            env={"PATH": os.environ["PATH"], "HOME": str(home)},
        )
    finally:
        shutil.rmtree(home, ignore_errors=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["issue-deleted", "snapgym", "kept"]


def test_template_over_an_image_builds(oci_backend: LocalBackend, debian_images: DebianImages) -> None:
    """A Template whose base is an image builds on it (an ``oci:`` source needs no registry settings)."""
    source = f"oci:{debian_images.layout.path}:whiteouts"
    template = Template(name="oci-wired", base=source, setup=["echo built > /srv/built"])
    snap = oci_backend.build(template)
    with oci_backend.create(snap) as sandbox:
        r = sandbox.exec("cat /srv/built /etc/snapgym-release; test -e /etc/issue || echo issue-deleted")
        assert r.stdout == "built\nwhiteouts\nissue-deleted\n"
