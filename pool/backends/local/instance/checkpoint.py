"""A local sandbox's snapshot: its writable layer frozen into a new read-only layer, and the record.

The sandbox's processes are stopped while its writable layer is copied (sparse files stay
sparse, hard links stay links). A failure, however it ends the copy, leaves nothing in the store.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pool.backends.local.runtime import BACKEND_NAME, Runtime
from pool.backends.local.settings import MIB
from pool.backends.local.store import layers
from pool.build.digest import combine
from pool.errors import SnapshotTooLargeError
from pool.snapshots import Snapshot
from pool.templates import Template


@dataclass(frozen=True, slots=True)
class BuildResult:
    """What a build's snapshot records beside the layers: its name, template, env, workdir, network."""

    snapshot_id: str
    template: Template
    env: Mapping[str, str]
    workdir: str
    build_network: Mapping[str, Any] = field(default_factory=dict)


def take(
    runtime: Runtime,
    *,
    sandbox_id: str,
    parent: Snapshot,
    upper: Path,
    pause: Callable[[], None],
    resume: Callable[[], None],
    build: BuildResult | None = None,
) -> Snapshot:
    """Freeze ``upper`` (the sandbox's writable layer) over ``parent`` into a stored snapshot.

    Args:
        pause: stops the sandbox's processes before the copy.
        resume: restarts them after it.
        build: set at the end of a build (the snapshot of a template); None: a checkpoint
            whose parent is ``parent``.

    Raises:
        SnapshotTooLargeError: the writable layer allocates more than ``max_snapshot_mb`` (or, when
            larger, the disk the parent's resources ask for: a task's ``storage`` may be filled).
        StoreFullError: the store's filesystem is full.
    """
    max_mb = max(runtime.settings.max_snapshot_mb, parent.resources.storage_mb or 0)
    new_layers, digest = parent.layers, parent.digest
    with runtime.store.layers.staging(f"snapshotting sandbox {sandbox_id}") as staged:
        pause()
        try:
            is_empty = layers.is_empty_dir(upper)
            if not is_empty:
                layers.copy_tree(upper, staged, max_bytes=max_mb * MIB)
        except SnapshotTooLargeError as exc:
            raise SnapshotTooLargeError(
                f"snapshot of sandbox {sandbox_id}: {exc}, over LocalBackend(max_snapshot_mb="
                f"{max_mb}); nothing was kept: delete files in the sandbox or raise the limit"
            ) from None
        finally:
            resume()
        if not is_empty:
            layer_id, layer_digest = runtime.store.layers.commit(staged)
            new_layers = (*parent.layers, layer_id)
            digest = combine(parent.digest, layer_digest)
    snap = _record(parent, new_layers, digest, build)
    runtime.store.save(snap)
    return snap


def _record(parent: Snapshot, new_layers: tuple[str, ...], digest: str, build: BuildResult | None) -> Snapshot:
    template = build.template if build else None
    return Snapshot(
        id=build.snapshot_id if build else digest[:32],
        digest=digest,
        backend=BACKEND_NAME,
        layers=new_layers,
        base=parent.base,
        env=dict(build.env) if build else dict(parent.env),
        workdir=build.workdir if build else parent.workdir,
        template=template.name if template else parent.template,
        parent=None if template else parent.id,
        created_at=time.time(),
        resources=template.resources if template else parent.resources,
        build_network=dict(build.build_network) if build else {},
    )
