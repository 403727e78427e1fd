"""Registry images and resources on E2B: a template built from the image, once per image and size.

E2B starts sandboxes from templates, not images: a task's image becomes a template built with the
SDK's template builder (``Template().from_image(reference, username, password)``, then
``Template.build``), named ``snapgym-img-<image key>-<size>``, so any process finds it again by name
(``Template.exists``) and builds nothing. A template fixes its sandboxes' size: CPUs (whole ones),
memory (MiB, even) and the free disk the build leaves (``min_free_disk_mb``, which E2B grows to as
best it can and never shrinks); so the size is part of the name. E2B has no GPUs. A build E2B
refuses or fails is an :class:`~pool.errors.ImageError` with E2B's reason.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from typing import Any

import e2b

from pool.backends.e2b.errors import provider_errors
from pool.backends.remote.provider import ProviderImage
from pool.errors import ImageError
from pool.resources import Resources

APPLIED = frozenset({"cpus", "memory_mb", "storage_mb"})
"""What a template built from an image sets: its CPUs, memory and free disk."""


def size(resources: Resources | None) -> dict[str, int]:
    """The template builder's size arguments for ``resources`` (CPUs rounded up to whole ones, memory
    up to an even number of MiB, as E2B takes them); empty: E2B's defaults."""
    if resources is None:
        return {}
    found: dict[str, int] = {}
    if resources.cpus is not None:
        found["cpu_count"] = max(1, math.ceil(resources.cpus))
    if resources.memory_mb is not None:
        found["memory_mb"] = resources.memory_mb + resources.memory_mb % 2
    if resources.storage_mb is not None:
        found["min_free_disk_mb"] = resources.storage_mb
    return found


def template_name(image: ProviderImage, resources: Resources | None) -> str:
    """The name of the template of ``image`` at that size (the same in every process)."""
    sized = ",".join(f"{key}={value}" for key, value in sorted(size(resources).items()))
    return f"snapgym-img-{image.key}-{hashlib.sha256(sized.encode()).hexdigest()[:8]}"


def template_for(api: Mapping[str, Any], image: ProviderImage, resources: Resources | None) -> str:
    """The name of ``image``'s template at the size of ``resources``: found, or built now.

    Raises:
        ImageError: E2B could not pull or build the image (its reason in the message).
        ConfigError: E2B refused the request or the key.
    """
    name = template_name(image, resources)
    with provider_errors(f"looking up the template {name}"):
        if e2b.Template.exists(name, **api):
            return name
    builder = e2b.Template().from_image(image.reference, username=image.username, password=image.password)
    try:
        with provider_errors(f"building the template {name} from {image.reference}"):
            build: Any = e2b.Template.build  # its keywords are typed per name; these are the size and the API's
            build(builder, name, **size(resources), **api)
    except e2b.BuildException as exc:
        raise ImageError(
            f"image {image.reference}: E2B could not build a template from it ({exc}); check that E2B can pull it "
            "(a public registry, or the registry's credentials in the backend's registry settings)"
        ) from exc
    return name
