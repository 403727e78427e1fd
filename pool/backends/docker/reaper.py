"""What dead runs left in the engine: their containers, and their checkpoint images.

Every container snapgym makes carries :data:`pool.labels.OWNER` (the making
process, on this machine); a checkpoint image carries its maker's too. When
that process is gone (:func:`pool.labels.owner_is_gone`: same host and boot,
pid no longer running, or an earlier boot), they are removed. Owners on other
machines, and template snapshot images (a cache that belongs to no run), are
left alone. A checkpoint image still in use by a live container stays.
"""

from __future__ import annotations

import contextlib
from typing import Any

from pool.backends.docker.catalog import ROLE
from pool.backends.docker.engine import engine_errors
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
    for image in images:
        owner = (image.get("Labels") or {}).get(OWNER, "")
        if owner and owner_is_gone(owner):
            dead.add(owner)
            with contextlib.suppress(Exception):  # in use by a live container: it stays
                api.remove_image(image["Id"], force=False)
    return len(dead)


def reap_run(client: Any, run: str, *, dry_run: bool = False) -> list[str]:
    """Remove every container labelled ``snapgym.run=run`` (whoever made it); their ids."""
    with engine_errors(f"listing the containers of run {run}"):
        containers = client.api.containers(all=True, filters={"label": f"{RUN}={run}"})
    found = [str(container["Id"]) for container in containers]
    if not dry_run:
        for container_id in found:
            with contextlib.suppress(Exception):  # gone meanwhile
                client.api.remove_container(container_id, force=True)
    return found
