"""Templates into snapshot images: find the base, run the steps in a container, commit.

Three ways in, one way out:

- a plain template, or a Dockerfile ``FROM snapgym/host``, or a prebuilt image
  (``prefer_prebuilt``, when the engine has or can pull it): the shared recipe
  (:func:`pool.build.images.recipe_for`: the base, the translated Dockerfile
  steps, the template's setup, files, healthcheck) runs in a build container
  over the base image, the local backend's way;
- a Dockerfile on any other image: the engine's builder builds it
  (:mod:`pool.backends.docker.images.dockerbuild`), then the template's own setup,
  files and healthcheck run in a build container over the result.

Either way the build container is committed (paused) into
``<prefix>/snapshot:<id>`` with the snapshot's record in a label; the id is
the template's content hash over the base's identity, so the next build of
the same template finds the image and runs nothing. The build's network
policy (see :mod:`pool.build.network`): a build container has no network of
its own and reaches out through snapgym's egress proxy, which enforces and
records the policy, where the proxy runs here (else the engine's bridge, for
a public policy only); the engine's builder gives ``RUN`` steps the bridge or
nothing, so a Dockerfile under an allowlist is built the shared recipe's way,
in a build container behind the proxy.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from pool.backends.docker.images import catalog, dockerbuild
from pool.backends.docker.images.bases import BaseImage, Bases
from pool.backends.docker.images.catalog import RECORD, ROLE, SANDBOX, SNAPSHOT
from pool.backends.docker.link import EngineLink
from pool.backends.docker.sandbox import DockerSandbox
from pool.backends.docker.transport import files
from pool.backends.docker.transport.engine import engine_errors
from pool.backends.docker.transport.execution import run_helper
from pool.build.dockerfile import ImageCopy
from pool.build.hostview import DEFAULT_PATH
from pool.build.images import BaseConfig, Recipe, file_target, recipe_for, run_recipe, with_prebuilt_failure
from pool.build.network import BuildRoute, build_route
from pool.errors import ConfigError
from pool.labels import OWNER
from pool.network.policy import NetworkMode
from pool.resources import Resources, require_supported
from pool.snapshots import BASE_ENV, Snapshot
from pool.templates import Template

Start = Callable[[], tuple[BaseImage, Recipe]]


class Builder:
    """Builds the templates of one backend (one build of a snapshot id at a time in this process)."""

    def __init__(self, link: EngineLink, bases: Bases) -> None:
        self._link = link
        self._settings = link.settings
        self._bases = bases
        self._lock = threading.Lock()
        self._building: dict[str, threading.Lock] = {}
        self._misses: dict[str, str] = {}
        """Prebuilt images the engine could not get, and why (named when the Dockerfile's base fails too)."""

    def build(self, template: Template) -> Snapshot:
        """The snapshot of ``template``: found by its tag, or built.

        Raises:
            BuildError: a step, the Dockerfile or the healthcheck failed (with its output).
            ConfigError: a base or image the engine cannot get, resources it cannot give.
        """
        require_supported(template.resources, backend="docker", gpu=False)
        try:
            identity, start = self._plan(template)
        except ConfigError as exc:  # say which images were wanted: a prebuilt one tried first, too
            failure = with_prebuilt_failure(template, self._misses, exc)
            if failure is exc:
                raise
            raise failure from exc
        snapshot_id = template.content_hash(identity)[:32]
        if cached := self._link.find_snapshot(snapshot_id):
            return cached
        with self._lock:
            lock = self._building.setdefault(snapshot_id, threading.Lock())
        with lock:
            if cached := self._link.find_snapshot(snapshot_id):
                return cached
            base, recipe = start()
            return self._run(template, snapshot_id, base, recipe)

    # -- planning -------------------------------------------------------------

    def _plan(self, template: Template) -> tuple[str, Start]:
        """The identity the snapshot id is taken over, and how to get the base and the recipe."""
        build = template.dockerfile
        bases = self._bases
        prefer_prebuilt = self._settings.prefer_prebuilt
        prebuilt = build is not None and build.prebuilt and prefer_prebuilt and self._can_get(build.prebuilt)
        engine_policy = template.build_network(runs_commands=True)
        if (
            build is not None
            and not prebuilt
            and not dockerbuild.builds_on_host(build)
            and engine_policy.mode is not NetworkMode.ALLOWLIST  # the engine's builder cannot filter by host
        ):
            engine_plan = dockerbuild.plan(build, bases)

            def built() -> tuple[BaseImage, Recipe]:
                assert build is not None
                # RUN steps get the engine's network when the build policy allows any (as in docker build)
                network = engine_policy.allows_any
                client = self._link.client
                image = dockerbuild.build_image(client, build, engine_plan, network=network, name=template.name)
                env = {"PATH": DEFAULT_PATH, **image.env, **template.env}
                recipe = Recipe(
                    base=engine_plan.first_image,
                    steps=tuple(template.setup),
                    env=env,
                    workdir=template.workdir or image.workdir or "/",
                    healthcheck=template.healthcheck,
                    network=template.build_network(runs_commands=bool(template.setup)),  # setup: more RUN steps
                    builder_route=BuildRoute.DIRECT if network else BuildRoute.NONE,
                )
                return image, recipe

            return engine_plan.identity, built
        recipe = recipe_for(
            template,
            base_config=self._base_config,
            host_path=bases.host_view.path_env,
            prefer_prebuilt=prefer_prebuilt,
            can_get=self._can_get,
        )
        identity = "+".join(bases.get(spec).identity for spec in (recipe.base, *recipe.images))
        return identity, lambda: (bases.get(recipe.base), recipe)

    def _base_config(self, spec: str) -> BaseConfig:
        image = self._bases.get(spec)
        return BaseConfig(env={"PATH": DEFAULT_PATH, **image.env}, workdir=image.workdir)

    def _can_get(self, image: str) -> bool:
        try:
            self._bases.get(image)
        except ConfigError as exc:
            self._misses[image] = str(exc)
            return False
        return True

    # -- running ---------------------------------------------------------------

    def _run(self, template: Template, snapshot_id: str, base: BaseImage, recipe: Recipe) -> Snapshot:
        link = self._link
        draft = Snapshot(
            id=snapshot_id,
            digest=base.image_id,
            backend=catalog.BACKEND,
            base=recipe.base,
            env={**BASE_ENV, **recipe.env},
            workdir=recipe.workdir,
            template=template.name,
            created_at=time.time(),
            resources=template.resources,
        )
        labels = {OWNER: self._settings.owner, ROLE: "build", SNAPSHOT: snapshot_id}
        route = build_route(
            recipe.network,
            proxy_available=link.egress.available,
            why_not=link.egress.unavailable_reason,
            backend="docker",
        )
        container = link.start_container(  # under the backend's limits, not the task's (as docker build does)
            replace(draft, resources=Resources()),
            labels,
            network=route is BuildRoute.DIRECT,
            limit_disk=False,
            what=f"the build container of template {template.name!r}",
        )
        sandbox = DockerSandbox(link, f"build-{snapshot_id[:12]}", container, draft, labels)
        try:
            network = run_recipe(sandbox, recipe, template, copy_from_image=self._copy_from_image, route=route)
            return self._commit(container, replace(draft, build_network=network.record()), base)
        finally:
            sandbox.close()

    def _commit(self, container: str, draft: Snapshot, base: BaseImage) -> Snapshot:
        conf = {
            "Labels": {
                OWNER: "",  # a template's image belongs to no run (labels of the container would carry over)
                SANDBOX: "",
                ROLE: "snapshot",
                SNAPSHOT: draft.id,
                RECORD: catalog.record_label(draft),
            },
            "Env": catalog.env_list(draft.env),
            "WorkingDir": draft.workdir,
            "Entrypoint": base.entrypoint or [],
            "Cmd": base.cmd or ["/bin/sh"],
        }
        repository = catalog.snapshot_tag(self._settings.image_prefix, draft.id).rsplit(":", 1)[0]
        with engine_errors(f"saving the snapshot of template {draft.template!r}"):
            api = self._link.api
            image_id = api.commit(container, repository=repository, tag=draft.id, conf=conf, pause=True)["Id"]
            attrs = api.inspect_image(image_id)
        return replace(draft, **catalog.image_fields(attrs), created_at=time.time())

    def _copy_from_image(self, sandbox: Any, step: ImageCopy) -> None:
        """``COPY --from=<image>``: the sources out of a container of the image that never starts."""
        api = self._link.api
        image = self._bases.get(step.image)
        with engine_errors(f"reading {step.image} for COPY --from"):
            source_container = api.create_container(
                image.image_id, command=["true"], host_config=api.create_host_config(network_mode="none")
            )["Id"]
        try:
            for source in step.sources:
                is_dir = files.is_folder(int(files.stat(api, source_container, source).get("mode", 0)))
                target = step.dest if is_dir else file_target(sandbox, step, source)
                top = target.rstrip("/").rsplit("/", 1)[-1]
                with files.get_archive(api, source_container, source) as response:
                    archive = files.retar(response, files.top_renamed(top), mode=step.mode)
                parent = target.rstrip("/").rsplit("/", 1)[0] or "/"
                run_helper(api, sandbox.container_id, ["mkdirs", parent])
                with archive:
                    files.put_archive(api, sandbox.container_id, parent, archive)
        finally:
            self._link.containers.remove_now(source_container)
