"""Building the local backend's snapshots: bases (the host, a root filesystem, an OCI image) and recipes.

A ``Builder`` turns a template into a stored snapshot: it finds or makes the base's layers,
starts a sandbox on them (through the backend's ``open_sandbox``), runs the recipe in it and
freezes the result. Bases are made once per store and checked once per process.
"""

from __future__ import annotations

import os
import posixpath
import shlex
import stat
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from pool.backends.local.instance.checkpoint import BuildResult
from pool.backends.local.oci.fetch import ImageFetcher
from pool.backends.local.oci.imagebase import image_base
from pool.backends.local.oci.layer import unpack_layer
from pool.backends.local.runtime import BACKEND_NAME
from pool.backends.local.sandbox import LocalSandbox
from pool.backends.local.settings import LocalSettings
from pool.backends.local.store import layers
from pool.backends.local.store.catalogue import BaseRecord, SnapshotStore
from pool.backends.local.store.layerview import Entry, LayerView
from pool.backends.local.store.mountpoints import mount_point_layer
from pool.build import hostview
from pool.build.digest import combine
from pool.build.dockerfile import ImageCopy
from pool.build.images import BaseConfig, Recipe, file_target, recipe_for, run_recipe, with_prebuilt_failure
from pool.build.network import BuildRoute, build_route
from pool.build.registry.settings import RegistrySettings
from pool.build.rootfs import RootfsSource
from pool.contract import Sandbox
from pool.egress.onhost.service import EgressService
from pool.errors import BuildError, ConfigError, ImageError, SnapshotError
from pool.resources import Resources, require_supported
from pool.snapshots import Snapshot
from pool.templates import HOST_BASE, Template

OpenSandbox = Callable[[Snapshot, bool], LocalSandbox]
"""Start a sandbox at a snapshot; the flag: with the host's network (a build step that asked for it)."""


@dataclass(frozen=True, slots=True)
class _Base:
    layers: tuple[str, ...]
    digest: str
    config: BaseConfig = field(default_factory=BaseConfig)


class Builder:
    """Builds templates into a backend's store; thread-safe.

    Args:
        store: the snapshot store.
        settings: the backend's settings: this host's layout (the host base) and the user-id
            mapping (layers are owned by sandbox root).
        registry: how images are fetched.
        prefer_prebuilt: start a Dockerfile template from its prebuilt image when it can be had.
        egress: the backend's egress service (whether a build step can reach the network by proxy).
    """

    def __init__(
        self,
        store: SnapshotStore,
        *,
        settings: LocalSettings,
        registry: RegistrySettings,
        prefer_prebuilt: bool,
        egress: EgressService,
    ) -> None:
        self.store = store
        self._settings = settings
        self._registry = registry
        self._prefer_prebuilt = prefer_prebuilt
        self._egress = egress
        self._lock = threading.RLock()
        self._bases: dict[str, _Base] = {}
        self._misses: dict[str, str] = {}
        """Prebuilt images that could not be had, and why (named when the Dockerfile's base fails too)."""
        self._fetcher: ImageFetcher | None = None

    def build(self, template: Template, open_sandbox: OpenSandbox) -> Snapshot:
        """:meth:`LocalBackend.build <pool.backends.local.backend.LocalBackend.build>`, with
        ``open_sandbox`` opening the build's sandbox (its errors are listed there)."""
        require_supported(template.resources, backend=BACKEND_NAME, gpu=False)
        try:
            recipe = self._recipe(template)
            base = self._base(recipe.base)
        except ImageError as exc:  # say which images were wanted: a prebuilt one tried first, too
            failure = with_prebuilt_failure(template, self._misses, exc)
            if failure is exc:
                raise
            raise failure from exc
        identity = combine(base.digest, *(self._base(image).digest for image in recipe.images))
        snap_id = template.content_hash(identity)[:32]
        if cached := self.store.find_usable(snap_id):
            return cached
        with self.store.lock(snap_id):
            if cached := self.store.find_usable(snap_id):
                return cached
            start = Snapshot(
                id=f"base-{snap_id}",
                digest=base.digest,
                backend=BACKEND_NAME,
                layers=base.layers,
                base=recipe.base,
                env=dict(recipe.env),
                workdir="/",
                # the build runs under the backend's memory and CPU limits, not the task's (as docker
                # build does: an install can need more memory than an episode gets), with at least
                # the disk the task asks for (a 10 GiB task's apt-get install needs that room)
                resources=Resources(storage_mb=template.resources.storage_mb),
            )
            route = build_route(
                recipe.network,
                proxy_available=self._egress.available,
                why_not=self._egress.unavailable_reason,
                backend=BACKEND_NAME,
            )
            sandbox = open_sandbox(start, route is BuildRoute.DIRECT)
            try:
                network = run_recipe(sandbox, recipe, template, copy_from_image=self._copy_from_image, route=route)
                snap = sandbox.snapshot_of_build(
                    BuildResult(snap_id, template, recipe.env, recipe.workdir, network.record())
                )
            finally:
                sandbox.close()
        return snap

    def _recipe(self, template: Template) -> Recipe:
        return recipe_for(
            template,
            base_config=lambda spec: self._base(spec).config,
            host_path=self._settings.host.path_env,
            prefer_prebuilt=self._prefer_prebuilt,
            can_get=self._can_get,
        )

    def _base(self, spec: str) -> _Base:
        with self._lock:
            if spec not in self._bases:
                if spec == HOST_BASE:
                    self._bases[spec] = self._host_base()
                elif spec.startswith(("/", "./", "../", "~")):
                    self._bases[spec] = self._rootfs_base(spec)
                else:
                    self._bases[spec] = self._image_base(spec)
            return self._bases[spec]

    def _can_get(self, image: str) -> bool:
        """Whether an image is in the store or can be fetched now (a prebuilt task image)."""
        try:
            self._base(image)
        except (ImageError, ConfigError) as exc:
            self._misses[image] = str(exc)
            return False
        return True

    def _copy_from_image(self, sandbox: Sandbox, step: ImageCopy) -> None:
        """``COPY --from=<image>``: read the files out of the image's layers and write them in."""
        layer_dirs = [self.store.layers.path(layer) for layer in self._base(step.image).layers]
        view = LayerView(layer_dirs, rootless=self._settings.rootless)
        for source in step.sources:
            entries = list(view.walk(source))
            is_dir = stat.S_ISDIR(entries[0].mode)
            target = step.dest if is_dir else file_target(sandbox, step, source)
            for entry in entries:
                _place_entry(sandbox, entry, posixpath.join(target, entry.path) if entry.path else target, step.mode)

    def _host_base(self) -> _Base:
        fingerprint = hostview.fingerprint(self._settings.host)
        name = f"host-{fingerprint[:32]}"
        config = BaseConfig(env={"PATH": self._settings.host.path_env})
        if cached := self._cached_base(name):
            return _Base(cached.layers, cached.digest, config)
        with self.store.layers.staging("writing the host base layer") as staged:
            hostview.write_skeleton(self._settings.host, staged)
            layers.shift_owners(staged, self._settings.id_offset)
            layer_id, layer_digest = self.store.layers.commit(staged)
        seed = f"host:{fingerprint}"
        base = _Base((layer_id,), combine(seed, layer_digest), config)
        self.store.save_base(name, BaseRecord(seed, base.layers, base.digest))
        return base

    def _rootfs_base(self, spec: str) -> _Base:
        rootfs = RootfsSource.find(spec, other_bases=("'host'",))
        source, name = rootfs.path, rootfs.name
        if cached := self._cached_base(name):
            return cached
        with self.store.layers.staging(f"unpacking the root filesystem {source}") as staged:
            if source.is_dir():
                layers.extract_rootfs(source, staged)
            else:  # confined like an image layer: no host file linked in, set-id bits kept
                try:
                    unpack_layer(source, staged, rootless=self._settings.rootless, image=spec)
                except ImageError as exc:
                    raise SnapshotError(f"cannot unpack root filesystem {source}: {exc}") from None
            layers.shift_owners(staged, self._settings.id_offset)
            rootfs_id, rootfs_digest = self.store.layers.commit(staged)
        mounts_id, mounts_digest = mount_point_layer(self.store.layers)
        seed = "rootfs"  # the content is all in the layers; where it came from is not state
        base = _Base((rootfs_id, mounts_id), combine(seed, rootfs_digest, mounts_digest))
        self.store.save_base(name, BaseRecord(seed, base.layers, base.digest))
        return base

    def _image_base(self, source: str) -> _Base:
        record, config = image_base(self.store, source, fetcher=self._image_fetcher())
        env = {"PATH": hostview.DEFAULT_PATH, **config.env}
        return _Base(record.layers, record.digest, BaseConfig(env=env, workdir=config.workdir))

    def _image_fetcher(self) -> ImageFetcher:
        with self._lock:
            if self._fetcher is None:
                self._fetcher = ImageFetcher(self.store.root / "oci" / "fetch", settings=self._registry)
            return self._fetcher

    def _cached_base(self, name: str) -> _Base | None:
        """The recorded base, checked against its layers; None when it must be made."""
        record = self.store.find_base(name)
        return None if record is None else _Base(record.layers, record.digest)


def _place_entry(sandbox: Sandbox, entry: Entry, target: str, mode: int | None) -> None:
    quoted = shlex.quote(target)
    if stat.S_ISDIR(entry.mode):
        result = sandbox.exec(f"mkdir -p {quoted}", timeout_s=60)
    elif stat.S_ISLNK(entry.mode):
        link = shlex.quote(os.readlink(entry.host_path))
        result = sandbox.exec(f'mkdir -p "$(dirname {quoted})" && ln -sfn {link} {quoted}', timeout_s=60)
    elif stat.S_ISREG(entry.mode):
        file_mode = mode if mode is not None else stat.S_IMODE(entry.mode)
        sandbox.write_file(target, entry.host_path.read_bytes(), mode=file_mode)
        return
    else:
        return  # sockets, FIFOs and devices are not copied, as in an image build
    if not result.ok:
        raise BuildError(f"COPY --from: cannot create {target}: {result.stderr.strip()[-500:]}")
