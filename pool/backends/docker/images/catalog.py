"""Snapshots as engine images: their tags, labels and records.

A template's snapshot is the image ``<prefix>/snapshot:<id>``, where the id is
the template's content hash; the image carries its :class:`~pool.snapshots.Snapshot`
record (minus the digest) in a label, so a second build finds it by tag and
rebuilds nothing. A checkpoint (``sandbox.snapshot()``) is the image
``<prefix>/checkpoint:<id>``, labelled with the backend instance that made it
(:data:`pool.labels.OWNER`): it lives as long as that process, and
``reap_orphans`` removes it after. A checkpoint of a sandbox that serves a run
(:data:`pool.labels.RUN`) carries the run too, and outlives a process that was
killed: the run's resume goes on from it and adopts it (see
:mod:`pool.backends.docker.transport.reaper`).

The digest is the image ID: the sha256 of the image's configuration, which
names every layer by the sha256 of its uncompressed content (``diff_ids``).
Containers are created by that ID, so a sandbox can only start from exactly
the image the snapshot names; a removed image is a
:class:`~pool.errors.SnapshotNotFoundError`. What the ID does not cover: the
engine does not rehash the layers on disk after it stored them (anyone with
root on the engine's machine can change them), and the host base's read-only
view of /usr comes from the host, not from the image (its identity is the
host's package fingerprint, as on the local backend).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

from pool.backends.docker.transport.engine import engine_errors, status_code, translate
from pool.errors import SnapshotError
from pool.labels import OWNER, RUN
from pool.snapshots import Snapshot

BACKEND = "docker"
ROLE = "snapgym.role"
"""What a container is for: "sandbox", "spare", "build", "verifier"; on images: "snapshot", "checkpoint"."""
SNAPSHOT = "snapgym.snapshot"
"""The snapshot a container started from, or an image holds."""
SANDBOX = "snapgym.sandbox"
"""The sandbox a container serves (a sandbox keeps its id across the containers restore hands it)."""
RECORD = "snapgym.record"
"""A template snapshot's record (JSON), on its image."""


def snapshot_tag(prefix: str, snapshot_id: str) -> str:
    """The tag of a template's snapshot image."""
    return f"{prefix}/snapshot:{snapshot_id}"


def checkpoint_tag(prefix: str, snapshot_id: str) -> str:
    """The tag of a checkpoint image."""
    return f"{prefix}/checkpoint:{snapshot_id}"


def env_dict(entries: list[str] | None) -> dict[str, str]:
    """An image configuration's ``Env`` (``["K=V", ...]``) as a dict."""
    found: dict[str, str] = {}
    for entry in entries or ():
        key, _, value = entry.partition("=")
        found[key] = value
    return found


def env_list(env: Mapping[str, str]) -> list[str]:
    """A dict of variables as ``["K=V", ...]``."""
    return [f"{k}={v}" for k, v in env.items()]


def record_label(snapshot: Snapshot) -> str:
    """A snapshot's record for its image's label: all but the id, digest and layers, which are the image's."""
    data = snapshot.to_dict()
    for key in ("digest", "layers", "id", "backend"):
        data.pop(key)
    return json.dumps(data, sort_keys=True)


def from_image(attrs: Mapping[str, Any], snapshot_id: str) -> Snapshot:
    """The snapshot a tagged image holds, from its record label.

    Raises:
        SnapshotError: the image has no record, another id, or a corrupt one.
    """
    labels = (attrs.get("Config") or {}).get("Labels") or {}
    if labels.get(SNAPSHOT) != snapshot_id or RECORD not in labels:
        raise SnapshotError(f"the image tagged for snapshot {snapshot_id} is not snapgym's; remove the tag")
    try:
        record = json.loads(labels[RECORD])
    except ValueError as exc:
        raise SnapshotError(f"snapshot {snapshot_id}'s image record is corrupt ({exc}); remove the image") from None
    return Snapshot.from_dict({**record, **image_fields(attrs), "id": snapshot_id})


def image_fields(attrs: Mapping[str, Any]) -> dict[str, Any]:
    """The digest, layers and backend of a snapshot, from its image."""
    return {
        "digest": str(attrs["Id"]),
        "layers": tuple((attrs.get("RootFS") or {}).get("Layers") or ()),
        "backend": BACKEND,
    }


def find(api: Any, prefix: str, snapshot_id: str) -> Snapshot | None:
    """The template snapshot tagged ``<prefix>/snapshot:<id>``, or None.

    Raises:
        SnapshotError: the tagged image is not snapgym's, or its record is corrupt.
    """
    try:
        attrs = api.inspect_image(snapshot_tag(prefix, snapshot_id))
    except Exception as exc:
        if status_code(exc) == 404:
            return None
        raise translate(exc, f"looking up snapshot {snapshot_id}") from None
    return from_image(attrs, snapshot_id)


def checkpoint(
    api: Any, container: str, *, prefix: str, owner: str, parent: Snapshot, run: str | None = None
) -> Snapshot:
    """Commit a container (paused meanwhile) into ``<prefix>/checkpoint:<id>``, owned by ``owner`` (and of
    ``run``, when the sandbox serves one)."""
    conf = {"Labels": {OWNER: owner, ROLE: "checkpoint", SANDBOX: "", **({RUN: run} if run else {})}}
    with engine_errors("taking a snapshot of a sandbox"):
        image_id = str(api.commit(container, conf=conf, pause=True)["Id"])
        snapshot_id = image_id.removeprefix("sha256:")[:32]
        repository, tag = checkpoint_tag(prefix, snapshot_id).rsplit(":", 1)
        api.tag(image_id, repository, tag)
        attrs = api.inspect_image(image_id)
    return Snapshot(
        id=snapshot_id,
        base=parent.base,
        env=dict(parent.env),
        workdir=parent.workdir,
        template=parent.template,
        parent=parent.id,
        created_at=time.time(),
        resources=parent.resources,
        **image_fields(attrs),
    )
