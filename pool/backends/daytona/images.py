"""Registry images and resources on Daytona: what ``CreateSandboxFromImageParams`` gets.

Daytona starts a sandbox from a registry image by building a snapshot of it
first: the SDK sends the Dockerfile ``FROM <reference>`` as the create's
``buildInfo``, and Daytona names the build after a hash of that Dockerfile, so
every create of the same reference, from any process, reuses the one build
(the sandbox waits in ``pending_build`` or ``building_snapshot`` the first
time). A build that fails leaves the sandbox in ``build_failed`` with Daytona's
reason, which :func:`build_failure` turns into an :class:`~pool.errors.ImageError`.

Daytona takes a create's resources only with an image (a snapshot carries its
own, and a snapshot made from a sandbox keeps that sandbox's): whole CPU
cores, GiB of memory and disk, GPUs and their types. snapgym's values are
rounded up to those units (:func:`sdk_resources`). Registry credentials are the
organisation's (Daytona's docker-registry API), never a create's, so an image
that carries them is refused (:func:`refuse_credentials`).
"""

from __future__ import annotations

import math
from typing import Any

import daytona

from pool.backends.remote.provider import ProviderImage
from pool.errors import ConfigError, ImageError
from pool.resources import Resources

REGISTRIES_URL = "https://app.daytona.io/dashboard/registries"
"""Where an organisation adds a private registry (or ``POST /docker-registry`` on Daytona's API)."""
_BUILD_FAILED = ("build_failed", "buildfailed")


def refuse_credentials(image: ProviderImage) -> None:
    """Daytona pulls private images with the organisation's registries, not a create's credentials.

    Raises:
        ConfigError: ``image`` carries a user name or password.
    """
    if image.username is None and image.password is None:
        return
    host = image.reference.split("/", 1)[0]
    raise ConfigError(
        f"Daytona takes registry credentials per organisation, not per sandbox, so it cannot pull "
        f"{image.reference} with the credentials snapgym has for {host}: add the registry {host} to the Daytona "
        f"organisation ({REGISTRIES_URL}, or POST /docker-registry on Daytona's API) and drop the credentials "
        "for it from snapgym's registry settings"
    )


def sdk_resources(resources: Resources | None) -> Any:
    """``resources`` as a ``daytona.Resources``, rounded up to Daytona's units (None: nothing asked).

    Raises:
        ConfigError: a GPU type Daytona does not offer.
    """
    if resources is None:
        return None
    fields: dict[str, Any] = {
        "cpu": math.ceil(resources.cpus) if resources.cpus is not None else None,
        "memory": _gib(resources.memory_mb),
        "disk": _gib(resources.storage_mb),
        "gpu": resources.gpus or None,
        "gpu_type": [gpu_type(name) for name in resources.gpu_types] or None,
    }
    if all(value is None for value in fields.values()):
        return None
    return daytona.Resources(**fields)


def gpu_type(name: str) -> Any:
    """Daytona's ``GpuType`` called ``name`` (any case).

    Raises:
        ConfigError: Daytona has no GPU type of that name.
    """
    offered = {t.value.lower(): t for t in daytona.GpuType if t.value != "unknown_default_open_api"}
    found = offered.get(name.lower())
    if found is None:
        names = ", ".join(t.value for t in offered.values())
        raise ConfigError(f"Daytona offers no GPU type {name!r}; it offers {names}: change the task's gpu_types")
    return found


def build_failure(exc: BaseException, image: ProviderImage) -> ImageError | None:
    """The ImageError for a create from ``image`` whose build Daytona reported failed, else None."""
    text = str(exc)
    if not isinstance(exc, daytona.DaytonaError) or not any(mark in text.lower() for mark in _BUILD_FAILED):
        return None
    reason = text.split("error reason:", 1)[-1].strip() if "error reason:" in text else text
    return ImageError(
        f"Daytona could not build a sandbox from image {image.reference}: {reason}; check that the image exists "
        "and that Daytona can pull it (a private registry must be added to the Daytona organisation, "
        f"{REGISTRIES_URL}), or push it to a registry Daytona reaches"
    )


def _gib(mb: int | None) -> int | None:
    return math.ceil(mb / 1024) if mb is not None else None
