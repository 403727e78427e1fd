"""A task's registry image as a Modal image: ``Image.from_registry`` with Modal's registry secret.

Modal builds an image from its definition (for a registry image, ``FROM <reference>``) the first
time a sandbox asks for it, and keeps one image per definition. The credentials of a private
registry travel as Modal asks for them: a ``Secret`` holding ``REGISTRY_USERNAME`` and
``REGISTRY_PASSWORD``, which Modal's builder pulls with; they are never a sandbox's environment.
Modal pulls over HTTPS: a plain-HTTP registry (``ProviderImage.insecure``) is reachable only by a
Modal server that can reach it (a self-hosted or stand-in one).
"""

from __future__ import annotations

from typing import Any

import modal

from pool.backends.remote.provider import ProviderImage
from pool.errors import ConfigError, ImageError


def registry_image(image: ProviderImage) -> Any:
    """The Modal image of ``image`` (lazy: it is built, or found built, at the sandbox's create).

    Raises:
        ConfigError: a user name without a password, or a password without a user name.
    """
    if (image.username is None) != (image.password is None):
        raise ConfigError(
            f"registry credentials for {image.reference} need both a user name and a password: Modal takes them "
            "as REGISTRY_USERNAME and REGISTRY_PASSWORD (set both in the backend's registry.credentials)"
        )
    if image.username is None:
        return modal.Image.from_registry(image.reference)
    secret = modal.Secret.from_dict({"REGISTRY_USERNAME": image.username, "REGISTRY_PASSWORD": image.password})
    return modal.Image.from_registry(image.reference, secret=secret)


def build_failed(image: ProviderImage, exc: Exception) -> ImageError:
    """What a failed Modal image build of ``image`` is raised as."""
    return ImageError(
        f"Modal could not build the image {image.reference}: {exc}; check that the registry serves it for "
        "linux/amd64 and that Modal can reach the registry (for a private one, set the backend's "
        "registry.credentials for its host)"
    )
