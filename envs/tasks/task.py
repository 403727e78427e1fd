"""Tasks on disk in the Harbor / Terminal-Bench 2 format, and the built-in suite.

A task is a directory::

    my-task/
    ├── instruction.md      what the agent is asked to do
    ├── task.toml           settings (see envs.tasks.taskconfig)
    ├── environment/        Dockerfile + build context, or setup.sh (+ files copied to /app)
    ├── tests/test.sh       the verifier; writes /logs/verifier/reward.txt or reward.json
    └── solution/solve.sh   the reference solution (optional)

``tests/`` enters the sandbox only at verification time, so the agent can
neither read nor edit it. ``solution/`` enters only when the oracle runs it.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from envs.errors import TaskError, TaskNotFoundError
from envs.tasks.taskconfig import TaskSettings, parse_task_toml
from pool.build.dockerfile import DockerfilePlan, translate
from pool.templates import HOST_IMAGE, DockerBuild, Template
from pool.verification import VerifyMode

BUILTIN_DIR = Path(__file__).parents[1] / "builtin"
"""Where the built-in suite lives."""
SETUP_SCRIPT_WORKDIR = "/app"
"""Working directory of tasks whose environment is a setup.sh instead of a Dockerfile."""
SETUP_SCRIPT_IMAGE = HOST_IMAGE
"""What a task without a Dockerfile starts from when its task.toml names no ``docker_image``: the host userland."""


@dataclass(frozen=True, slots=True)
class Task:
    """A loaded, validated task and the template of its start state."""

    id: str
    path: Path
    instruction: str
    settings: TaskSettings
    template: Template
    notes: tuple[str, ...] = field(default_factory=tuple)
    """What the Dockerfile translation ignored, for the curious."""
    workdir: str = "/"
    """Where the agent's commands run: ``[environment] workdir``, else the Dockerfile's last
    ``WORKDIR``, else ``/``."""

    @property
    def tests_dir(self) -> Path:
        """The verifier's files, copied to /tests at verification time."""
        return self.path / "tests"

    @property
    def verification(self) -> VerifyMode:
        """How the verifier is kept apart from the agent: the task's ``[snapgym] verification``, else strict."""
        return VerifyMode.parse(self.settings.verification or VerifyMode.STRICT)

    @property
    def outputs(self) -> tuple[str, ...]:
        """Directories whose end state a strict verifier sees: ``[snapgym] outputs``, else the working directory."""
        return self.settings.outputs or ((self.workdir,) if self.workdir != "/" else ())

    @property
    def solution_dir(self) -> Path | None:
        """The reference solution, when the task has one."""
        solution = self.path / "solution"
        return solution if (solution / "solve.sh").is_file() else None


def builtin_task_ids() -> list[str]:
    """Ids of the built-in suite, sorted."""
    return sorted(p.name for p in BUILTIN_DIR.iterdir() if (p / "task.toml").is_file())


def load_task(spec: str | Path | Task, *, bases: Mapping[str, str] | None = None) -> Task:
    """A task by built-in id or by directory path.

    Args:
        spec: a built-in id (``"csv-total"``), a task directory, or a Task (returned as is).
        bases: image -> where to get it instead, for ``FROM`` and ``COPY --from``: ``"host"``, a
            root filesystem path, or an image source (``docker-archive:/img.tar``, ``oci:/layout:tag``,
            another reference such as a mirror's).

    Raises:
        TaskNotFoundError: no built-in task has that id and no directory is at that path.
        TaskError: the directory is not a valid task; the message names the file and field.
    """
    if isinstance(spec, Task):
        return spec
    if not isinstance(spec, str | Path):
        raise TaskError(f"a task is a built-in id, a directory path or a Task, got {type(spec).__name__}")
    text = str(spec)
    if "/" not in text and (BUILTIN_DIR / text / "task.toml").is_file():
        return _load_dir(BUILTIN_DIR / text, dict(bases or {}))
    path = Path(spec).expanduser()
    if path.is_dir():
        return _load_dir(path, dict(bases or {}))
    close = difflib.get_close_matches(text, builtin_task_ids(), n=3)
    hint = f"; did you mean {', '.join(close)}?" if close else f"; built-in ids: {', '.join(builtin_task_ids())}"
    raise TaskNotFoundError(f"no built-in task {text!r} and no task directory at {path}{hint}")


def load_tasks(folder: str | Path, *, bases: Mapping[str, str] | None = None) -> list[Task]:
    """Every task in a folder of task directories (or the folder itself if it is one)."""
    return [_load_dir(path, dict(bases or {})) for path in task_dirs(folder)]


def task_dirs(folder: str | Path) -> list[Path]:
    """The task directories in a folder (or the folder itself if it is one), sorted, without loading them.

    Raises:
        TaskNotFoundError: no folder there, or it holds no task directory.
    """
    root = Path(folder).expanduser()
    if not root.is_dir():
        raise TaskNotFoundError(f"no task folder at {root}")
    if (root / "task.toml").is_file():
        return [root]
    found = [p for p in sorted(root.iterdir()) if (p / "task.toml").is_file()]
    if not found:
        raise TaskNotFoundError(f"{root} holds no task directories (folders with a task.toml)")
    return found


def builtin_tasks() -> list[Task]:
    """The built-in suite, loaded."""
    return [load_task(task_id) for task_id in builtin_task_ids()]


def _load_dir(path: Path, bases: dict[str, str]) -> Task:
    for required in ("instruction.md", "task.toml", "tests/test.sh"):
        if not (path / required).is_file():
            raise TaskError(f"{path} is not a task directory: {required} is missing")
    if (path / "environment" / "docker-compose.yaml").exists() or (
        path / "environment" / "docker-compose.yml"
    ).exists():
        raise TaskError(f"{path}/environment: docker-compose environments are not supported; use one Dockerfile")
    settings = parse_task_toml(path / "task.toml")
    build = _docker_build(path, settings, bases)
    plan = _validate(build, settings)
    workdir = settings.environment.workdir
    template = Template(
        name=f"task:{settings.name or path.name}",
        dockerfile=build,
        setup=settings.verifier_setup,
        workdir=workdir,
        healthcheck=settings.environment.healthcheck,
        network=settings.network.build,
        setup_timeout_s=settings.environment.build_timeout_s,
        resources=settings.environment.resources,
    )
    return Task(
        id=path.resolve().name,
        path=path.resolve(),
        instruction=(path / "instruction.md").read_text(),
        settings=settings,
        template=template,
        notes=plan.notes,
        workdir=workdir or plan.workdir or "/",
    )


def _docker_build(path: Path, settings: TaskSettings, bases: dict[str, str]) -> DockerBuild:
    """The task's Dockerfile, or one written for an ``environment/`` of a setup.sh and files."""
    environment = path / "environment"
    dockerfile = environment / "Dockerfile"
    prebuilt = settings.environment.docker_image
    if dockerfile.is_file():
        return DockerBuild(
            dockerfile=dockerfile.read_text(),
            context=str(environment.resolve()),
            path=str(dockerfile),
            image_sources=bases,
            prebuilt=prebuilt,
        )
    lines = [f"FROM {prebuilt or SETUP_SCRIPT_IMAGE}", f"WORKDIR {SETUP_SCRIPT_WORKDIR}"]
    if environment.is_dir():
        lines += [f"COPY {p.name} {SETUP_SCRIPT_WORKDIR}/{p.name}" for p in sorted(environment.iterdir())
                  if p.name != "setup.sh"]  # fmt: skip
        if (environment / "setup.sh").is_file():
            lines.append("COPY setup.sh /tmp/snapgym-setup.sh")
            lines.append("RUN bash /tmp/snapgym-setup.sh && rm -f /tmp/snapgym-setup.sh")
    context = environment if environment.is_dir() else path
    return DockerBuild(
        dockerfile="\n".join(lines) + "\n",
        context=str(context.resolve()),
        path=f"{environment} (no Dockerfile: written for its files and setup.sh)",
        image_sources=bases,
    )


def _validate(build: DockerBuild, settings: TaskSettings) -> DockerfilePlan:
    """Translate the Dockerfile once now, so an instruction no backend can realise fails the load."""
    return translate(build, extra_runs=settings.verifier_setup)
