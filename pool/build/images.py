"""The shared template build: what to start from, and the steps that make the start state.

A template is either plain (a base, setup commands, files) or a Dockerfile
(:class:`~pool.templates.DockerBuild`) followed by its setup and files. A
backend that builds by running steps in a sandbox (the local backend; the
Docker backend for the host base) asks :func:`recipe_for` what to start from
and which steps to run, starts a sandbox over that base (with the network
:func:`pool.build.network.build_route` picks for the recipe's policy), runs
:func:`run_recipe`, and freezes the result. A backend with its
own image builder uses only the parts it needs.

``prebuilt``: a task may name an image that already holds the built result
(task.toml ``docker_image``). With ``prefer_prebuilt``, when the backend can
get that image, the recipe starts from it and skips the Dockerfile.
"""

from __future__ import annotations

import posixpath
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

from pool.build.dockerfile import ImageCopy, Step, translate
from pool.build.hostview import DEFAULT_PATH
from pool.build.network import BuildNetwork, BuildRoute, attached
from pool.contract import Sandbox
from pool.errors import BuildError, SnapgymError
from pool.network.policy import NetworkPolicy
from pool.results import ExecResult
from pool.templates import HOST_BASE, Template


@dataclass(frozen=True, slots=True)
class BaseConfig:
    """What a base says about running in it (an image's ``Env`` and ``WorkingDir``)."""

    env: Mapping[str, str] = field(default_factory=lambda: {"PATH": DEFAULT_PATH})
    workdir: str | None = None


@dataclass(frozen=True, slots=True)
class Recipe:
    """A template resolved against its bases: start from ``base``, run ``steps``, place ``files``."""

    base: str
    steps: tuple[Step, ...]
    env: Mapping[str, str]
    """The environment of every build step and of every exec in episodes."""
    workdir: str
    healthcheck: str | None
    network: NetworkPolicy
    """What build steps may reach (the template's build policy)."""
    images: tuple[str, ...] = ()
    """Images that ``COPY --from`` steps copy out of (their identity is part of the snapshot's)."""
    notes: tuple[str, ...] = ()
    builder_route: BuildRoute | None = None
    """How the backend's own image builder's ``RUN`` steps reached the network, when one built the
    Dockerfile before ``steps`` (its route is ``none`` or ``direct``: it is not behind the proxy)."""


def recipe_for(
    template: Template,
    *,
    base_config: Callable[[str], BaseConfig],
    host_path: str,
    prefer_prebuilt: bool = False,
    can_get: Callable[[str], bool] = lambda image: False,
) -> Recipe:
    """What to start from and which steps to run, for a backend that builds by running steps.

    Args:
        template: the template.
        base_config: a base's environment and working directory (fetches an image's config).
        host_path: PATH of the host base.
        prefer_prebuilt: start from the build's ``prebuilt`` image when ``can_get`` it.
        can_get: whether the backend can have an image (cached, or fetchable now).

    Raises:
        DockerfileError: the Dockerfile has an instruction that cannot be realised.
    """
    build = template.dockerfile
    if build is None or (prefer_prebuilt and build.prebuilt and can_get(build.prebuilt)):
        base = build.prebuilt if build is not None and build.prebuilt else template.base
        config = base_config(base)
        env = {"PATH": host_path} if base == HOST_BASE else dict(config.env)
        workdir = template.workdir or config.workdir or "/"
        return Recipe(
            base=base,
            steps=tuple(template.setup),
            env={**env, **template.env},
            workdir=workdir,
            healthcheck=template.healthcheck,
            network=template.build_network(runs_commands=bool(template.setup)),
        )
    plan = translate(
        build,
        base_env=lambda base: base_config(base).env,
        host_path=host_path,
        extra_runs=template.setup,
    )
    workdir = template.workdir or plan.workdir or base_config(plan.base).workdir or "/"
    return Recipe(
        base=plan.base,
        steps=plan.steps,
        env={**plan.env, **template.env},
        workdir=workdir,
        healthcheck=template.healthcheck or plan.healthcheck,
        network=template.build_network(runs_commands=plan.runs_commands),
        images=tuple(step.image for step in plan.steps if isinstance(step, ImageCopy)),
        notes=plan.notes,
    )


ImageCopier = Callable[[Sandbox, ImageCopy], None]
"""Places the files of a ``COPY --from=<image>`` step in the build sandbox."""


def run_recipe(
    sandbox: Sandbox, recipe: Recipe, template: Template, *, copy_from_image: ImageCopier, route: BuildRoute
) -> BuildNetwork:
    """Run the recipe's steps, place the template's files, and check its healthcheck, the
    commands under the recipe's network policy by ``route`` (see :mod:`pool.build.network`).

    Returns:
        What the build's commands reached, for the snapshot's record.

    Raises:
        BuildError: a step or the healthcheck failed; the message holds the step, its output
            and what the network refused.
    """
    timeout = template.setup_timeout_s
    workdir = shlex.quote(recipe.workdir)
    _require_ok(sandbox.exec(f"mkdir -p {workdir}", timeout_s=timeout, cwd="/"), template, "create workdir", "")
    with attached(sandbox, BuildNetwork(recipe.network, route)) as network:
        for index, step in enumerate(recipe.steps, 1):
            if isinstance(step, ImageCopy):
                copy_from_image(sandbox, step)
                continue
            result = sandbox.exec(step, timeout_s=timeout, cwd=recipe.workdir)
            _require_ok(result, template, f"setup step {index}", step)
        for path, content in template.files.items():
            sandbox.write_file(path, content)
        if recipe.healthcheck:
            result = sandbox.exec(recipe.healthcheck, timeout_s=timeout, cwd=recipe.workdir)
            _require_ok(result, template, "healthcheck", recipe.healthcheck)
    if recipe.builder_route is not None:
        network.builder_route = recipe.builder_route
    return network


def file_target(sandbox: Sandbox, step: ImageCopy, source: str) -> str:
    """Where a file source of a ``COPY --from`` lands, by Docker's rule: inside ``dest`` when that
    is a folder (it ends in /, there are several sources, or it exists as a folder), else at
    ``dest``. (A folder source's contents go into ``dest`` itself.)"""
    if step.into_dir or sandbox.exec(f"test -d {shlex.quote(step.dest)}", timeout_s=60).ok:
        return posixpath.join(step.dest, posixpath.basename(source))
    return step.dest


_NO_SPACE = "No space left on device"
"""What a full disk makes every tool print (strerror of ENOSPC)."""


def _require_ok(result: ExecResult, template: Template, what: str, command: str) -> None:
    if result.ok:
        return
    why = f"timed out after {template.setup_timeout_s:g}s" if result.timed_out else f"exited {result.exit_code}"
    if _NO_SPACE in result.stdout or _NO_SPACE in result.stderr:
        why += (
            " (out of disk: the build's writable layer is full; give the task more `storage` in task.toml, "
            "or the backend a larger disk_limit_mb)"
        )
    raise BuildError(
        f"building template {template.name!r}: {what} {why}: {command[:2000]}\n"
        f"--- stdout (end) ---\n{result.stdout[-2000:]}\n--- stderr (end) ---\n{result.stderr[-2000:]}"
    )


_Failure = TypeVar("_Failure", bound=SnapgymError)


def with_prebuilt_failure(template: Template, misses: Mapping[str, str], exc: _Failure) -> _Failure:
    """``exc`` (an image the build needs could not be had), naming the task's prebuilt ``docker_image``
    too when it was tried first and could not be had either (``misses``: why each such image was
    not). Either image runs the task, so the user learns of both. Of ``exc``'s type."""
    prebuilt = template.dockerfile.prebuilt if template.dockerfile else None
    if not prebuilt or prebuilt not in misses or misses[prebuilt] == str(exc):
        return exc
    return type(exc)(f"{exc}; the task's prebuilt docker_image {prebuilt} could not be had either: {misses[prebuilt]}")
