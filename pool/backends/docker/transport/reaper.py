"""What dead runs left in the engine: their containers, and their checkpoint images.

Every container snapgym makes carries :data:`pool.labels.OWNER` (the making
process, on this machine); a checkpoint image carries its maker's too. When
that process is gone (:func:`pool.labels.owner_is_gone`: same host and boot,
pid no longer running, or an earlier boot), they are removed. Owners on other
machines, and template snapshot images (a cache that belongs to no run), are
left alone. A checkpoint image still in use by a live container stays.

A checkpoint of a run (labelled :data:`pool.labels.RUN`) is the exception: a
killed runner's durable episodes go on from it when the run is resumed
(``checkpoint_every``), so ``reap_orphans`` keeps it. The resume adopts every
checkpoint of its run whose maker is gone (:func:`dead_checkpoints_of_run`),
and its backend removes them when it closes; a run that is never resumed
is cleaned up by ``reap_run`` (``python -m pool.backends.reap --backend docker --run ID``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from typing import Any

from pool.backends.docker.images.catalog import ROLE
from pool.backends.docker.transport.engine import engine_errors, status_code
from pool.labels import OWNER, RUN, owner_is_gone


def reap_orphans(client: Any) -> int:
    """Remove the containers and checkpoint images of runs whose process is gone; how many runs."""
    api = client.api
    dead: set[str] = set()
    with engine_errors("listing snapgym's containers"):
        containers = api.containers(all=True, filters={"label": OWNER})
    for container in containers:
        owner = (container.get("Labels") or {}).get(OWNER, "")
        if owner and owner_is_gone(owner):
            dead.add(owner)
            with contextlib.suppress(Exception):
                api.remove_container(container["Id"], force=True)
    with engine_errors("listing snapgym's checkpoint images"):
        images = api.images(filters={"label": f"{ROLE}=checkpoint"})
    orphaned = []
    for image in images:
        labels = image.get("Labels") or {}
        owner = labels.get(OWNER, "")
        if owner and owner_is_gone(owner) and not labels.get(RUN):  # a run's checkpoint waits for its resume
            dead.add(owner)
            orphaned.append(str(image["Id"]))
    remove_images(api, orphaned)  # one in use by a live container stays
    return len(dead)


def dead_checkpoints_of_run(api: Any, run: str) -> list[str]:
    """The ids of run ``run``'s checkpoint images whose maker is gone (what a killed runner of it left)."""
    images = _checkpoints_of_run(api, run)
    return [str(image["Id"]) for image in images if owner_is_gone((image.get("Labels") or {}).get(OWNER, ""))]


def _checkpoints_of_run(api: Any, run: str) -> list[dict[str, Any]]:
    with engine_errors(f"listing the checkpoints of run {run}"):
        return list(api.images(filters={"label": [f"{ROLE}=checkpoint", f"{RUN}={run}"]}))


def reap_run(client: Any, run: str, *, dry_run: bool = False) -> list[str]:
    """Remove every container labelled ``snapgym.run=run`` (whoever made it), then the run's checkpoint
    images; the containers' ids, then ``checkpoint <image id>`` for each image."""
    api = client.api
    with engine_errors(f"listing the containers of run {run}"):
        containers = api.containers(all=True, filters={"label": f"{RUN}={run}"})
    found = [str(container["Id"]) for container in containers]
    if not dry_run:
        for container_id in found:
            with contextlib.suppress(Exception):  # gone meanwhile
                api.remove_container(container_id, force=True)
    images = [str(image["Id"]) for image in _checkpoints_of_run(api, run)]
    if not dry_run:
        remove_images(api, images, force=True)
    return found + [f"checkpoint {image_id}" for image_id in images]


def remove_images(api: Any, image_ids: Iterable[str], *, force: bool = False) -> list[str]:
    """Remove images, children before parents (a checkpoint taken in a sandbox that went on from another
    checkpoint is that one's child, which the engine refuses to remove first); what could not be removed
    (in use by a container; ``force`` does not remove an image a container runs from either)."""
    remaining = list(dict.fromkeys(image_ids))
    while remaining:
        refused = []
        for image_id in remaining:
            try:
                api.remove_image(image_id, force=force)
            except Exception as exc:
                if status_code(exc) != 404:  # a 404: gone meanwhile
                    refused.append(image_id)
        if len(refused) == len(remaining):
            return refused
        remaining = refused
    return []
