"""A Dockerfile built by the engine's own builder.

Every ``FROM`` image is settled before the build: an entry of the build's
``image_sources`` is realised as a base (a root filesystem, an archive, an
OCI image: see :mod:`pool.backends.docker.images.bases`), anything else is the
engine's or pulled; then the ``FROM`` line names the image by its ID, so the
build uses exactly the images the snapshot's identity was taken over, and a
missing image fails before the build with a message saying how to provide
it. The Dockerfile's text is handed to the builder beside the untouched
context (the SDK adds it to the context archive under a random name;
``.dockerignore`` applies).

A ``FROM snapgym/host`` (or an image mapped to ``host``) is not built here:
the host view's folders must be bound while ``RUN`` steps run, which the
builder cannot do, so :mod:`pool.backends.docker.images.builder` runs the
translated steps (:mod:`pool.build.dockerfile`) in a container instead.
"""

from __future__ import annotations

import re
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pool.backends.docker.images.bases import BaseImage, Bases
from pool.backends.docker.images.catalog import ROLE
from pool.backends.docker.transport.engine import engine_errors
from pool.build.dockerfile import resolve_image
from pool.errors import BuildError
from pool.templates import HOST_BASE, DockerBuild

_OUTPUT_TAIL = 4000


@dataclass(frozen=True, slots=True)
class EnginePlan:
    """A Dockerfile ready for the builder: its ``FROM`` images pinned by ID."""

    text: str
    identity: str
    """The pinned images, in order: what the snapshot's identity is taken over."""
    first_image: str
    """The first ``FROM`` as written (the snapshot's ``base``)."""


def from_images(text: str) -> list[tuple[int, str, str]]:
    """(line index, image as written, stage name or "") of every ``FROM``, continuations joined."""
    found = []
    for index, line in enumerate(text.splitlines()):
        words = line.split()
        if len(words) >= 2 and words[0].upper() == "FROM":
            names = [w for w in words[1:] if not w.startswith("--")]
            if names:
                stage = names[2] if len(names) >= 3 and names[1].upper() == "AS" else ""
                found.append((index, names[0], stage))
    return found


def builds_on_host(build: DockerBuild) -> bool:
    """Whether the Dockerfile's (first) ``FROM`` is the host userland."""
    images = from_images(build.dockerfile)
    return bool(images) and resolve_image(images[0][1], build.image_sources) == HOST_BASE


def plan(build: DockerBuild, bases: Bases) -> EnginePlan:
    """Pin every ``FROM`` image (realising image sources, pulling what the engine lacks).

    Raises:
        ConfigError: an image the engine has not and cannot get (saying how to provide it).
    """
    lines = build.dockerfile.splitlines()
    stages: set[str] = set()
    pinned: list[str] = []
    images = from_images(build.dockerfile)
    for index, image, stage in images:
        if image in stages or image == "scratch" or "$" in image:
            pinned.append(image)
        else:
            source = resolve_image(image, build.image_sources)
            realised = bases.get(source)
            pinned.append(realised.image_id)
            lines[index] = re.sub(re.escape(image), realised.image_id, lines[index], count=1)
        if stage:
            stages.add(stage)
    return EnginePlan(
        text="\n".join(lines) + "\n",
        identity="dockerfile:" + ",".join(pinned),
        first_image=images[0][1] if images else "scratch",
    )


def build_image(client: Any, build: DockerBuild, engine_plan: EnginePlan, *, network: bool, name: str) -> BaseImage:
    """Run the engine's builder; the built image.

    Raises:
        BuildError: a step failed; the message holds the end of the builder's output.
    """
    output: list[str] = []
    image_id: str | None = None
    with tempfile.TemporaryDirectory(prefix="snapgym-dockerfile-") as tmp:
        dockerfile = Path(tmp) / "Dockerfile"
        dockerfile.write_text(engine_plan.text)
        with engine_errors(f"building the Dockerfile of template {name!r}"):
            for chunk in client.api.build(
                path=build.context,
                dockerfile=str(dockerfile),
                rm=True,
                forcerm=True,
                pull=False,
                network_mode="bridge" if network else "none",
                labels={ROLE: "dockerfile"},
                decode=True,
            ):
                image_id = _follow(chunk, output, build, name) or image_id
        if image_id is None:
            raise BuildError(f"building template {name!r}: the builder named no image\n{_tail(output)}")
        with engine_errors("reading the built image"):
            attrs = client.api.inspect_image(image_id)
    return BaseImage.of(attrs, identity=engine_plan.identity)


def _follow(chunk: Mapping[str, Any], output: list[str], build: DockerBuild, name: str) -> str | None:
    if "stream" in chunk:
        output.append(str(chunk["stream"]))
    if "error" in chunk:
        detail = (chunk.get("errorDetail") or {}).get("message") or chunk["error"]
        raise BuildError(
            f"building template {name!r}: the Dockerfile {build.path} failed: {detail}\n"
            f"--- builder output (end) ---\n{_tail(output)}"
        )
    aux = chunk.get("aux")
    if isinstance(aux, Mapping) and aux.get("ID"):
        return str(aux["ID"])
    return None


def _tail(output: list[str]) -> str:
    return "".join(output)[-_OUTPUT_TAIL:]
