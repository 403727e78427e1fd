"""Dockerfile translation: what maps to a template, what is refused (naming the line), and that COPY/ENV/RUN
land in a real sandbox as Docker would place them."""

from __future__ import annotations

import hashlib
import io
import tarfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import envs
from pool import DockerBuild, LocalBackend
from pool.build.dockerfile import DockerfilePlan, ImageCopy
from pool.build.dockerfile import translate as translate_build
from tests.support.fixtures.envs_fixtures import write_task

HOST_PATH = "/usr/bin:/bin"
BIG = bytes(range(256)) * 600  # 150 KiB: more than one 64 KiB write chunk


def nothing_missing(packages: list[str]) -> list[str]:
    """A host that has every apt package."""
    return []


def translate(
    tmp_path: Path,
    text: str,
    *,
    bases: dict[str, str] | None = None,
    missing: Callable[[list[str]], list[str]] = nothing_missing,
    files: dict[str, str] | None = None,
) -> DockerfilePlan:
    """Translate ``text`` as tmp_path/ctx/Dockerfile, with ``files`` in the build context."""
    context = tmp_path / "ctx"
    context.mkdir(exist_ok=True)
    for name, content in (files or {}).items():
        (context / name).parent.mkdir(parents=True, exist_ok=True)
        (context / name).write_text(content)
    path = str(context / "Dockerfile")
    build = DockerBuild(dockerfile=text, context=str(context), path=path, image_sources=bases or {})
    return translate_build(build, host_path=HOST_PATH, host_has_packages=missing)


# -- FROM -----------------------------------------------------------------------------


@pytest.mark.parametrize("image", ["snapgym/host", "snapgym/host:latest", "host"])
def test_snapgym_host_is_the_host_base(tmp_path: Path, image: str) -> None:
    """FROM snapgym/host runs on the host userland, with ~/.local/bin on PATH."""
    plan = translate(tmp_path, f"FROM {image}\n")
    assert plan.base == "host"
    assert plan.env["PATH"] == f"/root/.local/bin:{HOST_PATH}"
    assert plan.workdir is None


@pytest.mark.parametrize(
    "image",
    [
        "python:3.11-slim",
        "debian:bookworm-slim",
        "docker.io/library/python:3.12",
        "python:3.11-slim@sha256:" + "a" * 64,
        "ghcr.io/laude-institute/t-bench/python-3-13:20250620",
    ],
)
def test_any_other_image_is_its_own_base(tmp_path: Path, image: str) -> None:
    """An image is never silently replaced by the host: it is the base, fetched as it is named."""
    plan = translate(tmp_path, f"FROM {image}\nRUN apt-get install -y nosuchpkg\n")
    assert plan.base == image
    assert plan.images == (image,)
    assert not any("/.snapgym-build" in step for step in plan.steps)  # apt runs in the image, not on the host


@pytest.mark.parametrize("image", ["myimg", "myimg:1.0", "myimg@sha256:" + "b" * 64])
def test_a_bases_mapping_gives_the_image_a_root_filesystem(tmp_path: Path, image: str) -> None:
    """bases={"myimg": tarball} maps the image with any tag or digest; apt is not checked on the host then."""

    def everything_missing(packages: list[str]) -> list[str]:
        return packages

    plan = translate(
        tmp_path,
        f"FROM {image}\nRUN apt-get install -y nosuchpkg\n",
        bases={"myimg": "/some/rootfs.tar"},
        missing=everything_missing,
    )
    assert plan.base == "/some/rootfs.tar"
    assert not any("/.snapgym-build" in step for step in plan.steps)


def test_a_bases_mapping_of_a_tagged_image_covers_that_tag_only(tmp_path: Path) -> None:
    """A mapping for a tagged image wins for that tag; another tag is fetched as itself."""
    plan = translate(tmp_path, "FROM python:3.11-slim\n", bases={"python:3.11-slim": "/rootfs/py.tar"})
    assert plan.base == "/rootfs/py.tar"
    other = translate(tmp_path, "FROM python:3.12\n", bases={"python:3.11-slim": "/rootfs/py.tar"})
    assert other.base == "python:3.12"


def test_an_image_mapped_to_the_host_gets_the_host_base(tmp_path: Path) -> None:
    """bases={"python": "host"} runs python images on the host userland, explicitly."""
    plan = translate(tmp_path, "FROM python:3.11-slim\n", bases={"python": "host"})
    assert plan.base == "host" and plan.env["PATH"] == f"/root/.local/bin:{HOST_PATH}"


def test_copy_from_an_image_is_a_step_and_from_a_stage_is_refused(tmp_path: Path) -> None:
    """COPY --from=<image> copies out of that image (mapped through bases); --from=<stage> is multi-stage."""
    plan = translate(
        tmp_path,
        "FROM snapgym/host\nCOPY --from=ghcr.io/astral-sh/uv:0.8 /uv /uvx /opt/bin/\n",
        bases={"ghcr.io/astral-sh/uv": "oci:/mirror/uv:0.8"},
    )
    copies = [step for step in plan.steps if isinstance(step, ImageCopy)]
    assert copies == [ImageCopy("oci:/mirror/uv:0.8", ("/uv", "/uvx"), "/opt/bin", True)]
    assert plan.images == ("oci:/mirror/uv:0.8",)
    with pytest.raises(envs.DockerfileError, match="multi-stage"):
        translate(tmp_path, "FROM debian AS build\nCOPY --from=build /x /y\n")


# -- refused instructions ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "line", "why"),
    [
        ("FROM python:3.11-slim AS build\nRUN true\nFROM python:3.11-slim\n", 3, "multi-stage"),
        ("FROM python:3.11-slim AS build\nCOPY --from=build /out /app/\n", 2, "multi-stage"),
        ("FROM python:3.11-slim\nCOPY --from=0 /out /app/\n", 2, "multi-stage"),
        ("FROM python:3.11-slim\nADD https://example.com/x.tar.gz /opt/\n", 2, "URL"),
        ("FROM python:3.11-slim\nRUN <<EOF\necho hi\nEOF\n", 2, "heredoc"),
        ("FROM python:3.11-slim\nRUN --mount=type=cache,target=/root/.cache true\n", 2, "--mount"),
        ("FROM python:3.11-slim\nWORKDIR /app\nUSER app\n", 3, "USER app"),
        ("FROM python:3.11-slim\nONBUILD RUN true\n", 2, "ONBUILD"),
        ("FROM python:3.11-slim\nFROBNICATE now\n", 2, "FROBNICATE is not supported"),
        ("FROM python:3.11-slim\nCOPY missing.txt /app/\n", 2, "not in the build context"),
        ("FROM python:3.11-slim\nCOPY ../outside.txt /app/\n", 2, "outside the build context"),
        ("FROM snapgym/host\nCOPY data.txt /usr/local/bin/\n", 2, "read-only"),
        ("FROM python:3.11-slim\nCOPY data.txt\n", 2, "source and a destination"),
        ('FROM python:3.11-slim\nRUN ["echo", 1]\n', 2, "JSON list of strings"),
        ("FROM python:3.11-slim\n\nENV A=1 LONELY\n", 3, "no value"),
        ("FROM snapgym/host\nHEALTHCHECK --interval=5s\n", 2, "HEALTHCHECK"),
        ("WORKDIR /app\n", 1, "no FROM"),
    ],
    ids=lambda value: value if isinstance(value, str) and "\n" not in value else None,
)
def test_unsupported_instructions_are_errors_naming_the_line(tmp_path: Path, body: str, line: int, why: str) -> None:
    """Each unsupported construct raises DockerfileError with path:line and the reason."""
    (tmp_path / "outside.txt").write_text("secret\n")
    with pytest.raises(envs.DockerfileError) as raised:
        translate(tmp_path, body, files={"data.txt": "x\n"})
    message = str(raised.value)
    assert f"Dockerfile:{line}: " in message and why in message, message


def test_user_root_and_ignored_instructions_are_accepted(tmp_path: Path) -> None:
    """USER root is fine; CMD, ENTRYPOINT, EXPOSE, LABEL, VOLUME are ignored and listed in notes."""
    plan = translate(
        tmp_path,
        "FROM snapgym/host\nUSER root\nUSER 0:0\nEXPOSE 8080\nLABEL a=b\nVOLUME /data\n"
        'ENTRYPOINT ["python"]\nCMD ["-m", "http.server"]\n',
    )
    notes = "\n".join(plan.notes)
    for keyword in ("EXPOSE", "LABEL", "VOLUME", "ENTRYPOINT", "CMD"):
        assert f"{keyword} ignored" in notes
    assert "line 8: CMD" in notes


# -- ENV, ARG, WORKDIR, HEALTHCHECK ----------------------------------------------------------


def test_env_in_both_forms_with_variable_expansion(tmp_path: Path) -> None:
    """ENV key=value (quoted, several per line, continued) and ENV key value; $VAR, ${VAR}, defaults, PATH."""
    plan = translate(
        tmp_path,
        "FROM snapgym/host\n"
        'ENV A=1 B="two words" \\\n    C=${A}x\n'
        "ENV LEGACY legacy value with $A\n"
        "ENV D=$A-${B} E=${UNSET:-fallback} F=${A:+set} G=${UNSET:+never}\n"
        "ENV PATH=/opt/tool/bin:$PATH\n",
    )
    assert plan.env["A"] == "1"
    assert plan.env["B"] == "two words"
    assert plan.env["C"] == "x"  # A is set on the same line: Docker expands with the value from before it
    assert plan.env["LEGACY"] == "legacy value with 1"
    assert plan.env["D"] == "1-two words"
    assert plan.env["E"] == "fallback"
    assert plan.env["F"] == "set"
    assert plan.env["G"] == ""
    assert plan.env["PATH"] == f"/opt/tool/bin:/root/.local/bin:{HOST_PATH}"


def test_env_keeps_an_escaped_dollar_literal(tmp_path: Path) -> None:
    """ENV A=\\$HOME stores the text $HOME, as Docker does."""
    plan = translate(tmp_path, "FROM snapgym/host\nENV HOME=/root\nENV A=\\$HOME\n")
    assert plan.env["A"] == "$HOME"


def test_env_expands_variables_with_values_from_before_the_instruction(tmp_path: Path) -> None:
    """Docker's documented example: ENV abc=hello / ENV abc=bye def=$abc gives def=hello."""
    plan = translate(tmp_path, "FROM snapgym/host\nENV abc=hello\nENV abc=bye def=$abc\nENV ghi=$abc\n")
    assert (plan.env["abc"], plan.env["def"], plan.env["ghi"]) == ("bye", "hello", "bye")


def test_arg_defaults_reach_from_env_and_run_but_not_the_runtime_env(tmp_path: Path) -> None:
    """ARG defaults expand in FROM, ENV and RUN; an ARG is not part of the episode's environment."""
    plan = translate(
        tmp_path,
        "ARG PY=3.11\nFROM python:${PY}-slim\nARG VERSION=1.2\nARG EMPTY\nENV APP_VERSION=$VERSION\n"
        "RUN echo $VERSION > /tmp/v\n",
    )
    assert plan.image == "python:3.11-slim"
    assert plan.env["APP_VERSION"] == "1.2"
    assert "VERSION" not in plan.env and "PY" not in plan.env
    run = [step for step in plan.steps if "echo $VERSION" in step]
    assert len(run) == 1 and "export VERSION=1.2" in run[0]


def test_workdir_relative_paths_resolve_against_the_previous_one(tmp_path: Path) -> None:
    """WORKDIR app after WORKDIR /srv is /srv/app; ../data then /srv/data; each one is created."""
    plan = translate(tmp_path, "FROM snapgym/host\nENV BASE=/srv\nWORKDIR $BASE\nWORKDIR app\nWORKDIR ../data\n")
    assert plan.workdir == "/srv/data"
    assert [s for s in plan.steps if s.startswith("mkdir -p /srv")] == [
        "mkdir -p /srv",
        "mkdir -p /srv/app",
        "mkdir -p /srv/data",
    ]


def test_healthcheck_cmd_becomes_the_template_healthcheck(tmp_path: Path) -> None:
    """HEALTHCHECK CMD (shell or exec form) is kept; HEALTHCHECK NONE clears it."""
    shell_form = translate(tmp_path, "FROM snapgym/host\nHEALTHCHECK --interval=5s CMD test -f /app/ok\n")
    assert shell_form.healthcheck == "test -f /app/ok"
    exec_form = translate(tmp_path, 'FROM snapgym/host\nHEALTHCHECK CMD ["test", "-f", "/app/ok"]\n')
    assert exec_form.healthcheck == "test -f /app/ok"
    cleared = translate(tmp_path, "FROM snapgym/host\nHEALTHCHECK CMD true\nHEALTHCHECK NONE\n")
    assert cleared.healthcheck is None


# -- apt on the host base --------------------------------------------------------------------


def test_apt_packages_missing_on_the_host_are_listed(tmp_path: Path) -> None:
    """apt-get install of packages the host lacks raises DockerfileError listing exactly those packages."""
    asked: list[list[str]] = []

    def host_lacks(packages: list[str]) -> list[str]:
        asked.append(packages)
        return [p for p in packages if p in {"libfoo-dev", "zzz-tool"}]

    text = (
        "FROM snapgym/host\n"
        "RUN apt-get update && \\\n"
        "    apt-get install -y --no-install-recommends -o Dpkg::Options::=--force-confold \\\n"
        "      curl libfoo-dev zzz-tool=1.0 && rm -rf /var/lib/apt/lists/*\n"
    )
    with pytest.raises(envs.DockerfileError, match=r"Dockerfile:2: apt packages libfoo-dev, zzz-tool") as raised:
        translate(tmp_path, text, missing=host_lacks)
    assert asked == [["curl", "libfoo-dev", "zzz-tool"]]
    assert "curl" not in str(raised.value).split("install them")[0]
    assert "snapgym/host" in str(raised.value)


def test_apt_packages_present_on_the_host_translate(tmp_path: Path) -> None:
    """When the host has every package, apt-get install translates, with a build-time apt shim."""
    plan = translate(tmp_path, "FROM snapgym/host\nRUN apt install -y git\n")
    assert plan.runs_commands
    assert any("/.snapgym-build/bin/apt-get" in step for step in plan.steps)
    assert plan.steps[-1] == "rm -rf /.snapgym-build"


# -- end to end: a task built from a Dockerfile, run in a sandbox --------------------------------


def _tarball() -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        data = b"from the tarball\n"
        info = tarfile.TarInfo("inner/hello.txt")
        info.size = len(data)
        info.mode = 0o640
        tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


RICH_DOCKERFILE = """\
# A Dockerfile using most of what the translator supports.
FROM snapgym/host
ARG GREETING_WORD=hi
ENV APP_HOME=/srv \\
    MODE=test
ENV LEGACY legacy value
WORKDIR $APP_HOME
WORKDIR app
COPY data.txt ./data.txt
COPY run.sh bin/
COPY --chmod=600 data.txt secret.txt
COPY conf /etc/myconf
COPY *.csv csv/
COPY big.bin empty.txt "name with space.txt" blobs/
ADD bundle.tar /opt/bundle/
RUN echo "$GREETING_WORD from $(pwd) in $MODE" > made-by-run.txt
RUN ["sh", "-c", "ls csv > csv-listing.txt"]
EXPOSE 8080
CMD ["sleep", "infinity"]
"""


@pytest.fixture(scope="module")
def rich_env(backend: LocalBackend, tmp_path_factory: pytest.TempPathFactory) -> Iterator[envs.ShellEnv]:
    """A ShellEnv over a task built from RICH_DOCKERFILE."""
    task = write_task(
        tmp_path_factory.mktemp("dockerfile"),
        "rich",
        dockerfile=RICH_DOCKERFILE,
        context={
            "data.txt": "hello\n",
            "run.sh": "#!/bin/sh\necho ran\n",
            "conf/a.ini": "[a]\n",
            "conf/sub/b.ini": "[b]\n",
            "x1.csv": "1\n",
            "x2.csv": "2\n",
            "y.dat": "not a csv\n",
            "big.bin": BIG,
            "empty.txt": "",
            "name with space.txt": "spaced\n",
            "bundle.tar": _tarball(),
        },
    )
    (task / "environment" / "run.sh").chmod(0o755)
    (task / "environment" / "data.txt").chmod(0o644)
    env = envs.ShellEnv(task, backend=backend)
    env.reset()
    yield env
    env.close()


def sh(env: envs.ShellEnv, command: str) -> str:
    """The stdout of a command that must succeed."""
    obs, _, _, _, info = env.step(command)
    assert int(obs["exit_code"]) == 0, obs["output"]
    return str(info["stdout"])


def test_workdir_and_env_reach_the_episode(rich_env: envs.ShellEnv) -> None:
    """The episode starts in the last WORKDIR with ENV set; ARGs are build-time only."""
    assert rich_env.task.workdir == "/srv/app"
    out = sh(rich_env, 'pwd; echo "$APP_HOME|$MODE|$LEGACY|${GREETING_WORD-unset}"')
    assert out == "/srv/app\n/srv|test|legacy value|unset\n"


def test_copied_files_land_with_content_and_mode(rich_env: envs.ShellEnv) -> None:
    """COPY of a file (relative dest), into a dir (trailing /), and --chmod keep content and mode."""
    assert sh(rich_env, "cat data.txt secret.txt") == "hello\nhello\n"
    assert sh(rich_env, "stat -c '%a %n' data.txt bin/run.sh secret.txt") == (
        "644 data.txt\n755 bin/run.sh\n600 secret.txt\n"
    )
    assert sh(rich_env, "bin/run.sh") == "ran\n"


def test_copied_directories_keep_their_tree(rich_env: envs.ShellEnv) -> None:
    """COPY of a directory copies its contents (not the directory itself), recursively."""
    assert sh(rich_env, "(cd /etc/myconf && find . -type f | sort && cat a.ini sub/b.ini)") == (
        "./a.ini\n./sub/b.ini\n[a]\n[b]\n"
    )


def test_copy_globs_and_several_sources(rich_env: envs.ShellEnv) -> None:
    """A glob copies only matching files; several sources (one quoted with a space) go into the directory."""
    assert sh(rich_env, "ls csv") == "x1.csv\nx2.csv\n"
    assert sh(rich_env, "cat csv/x1.csv csv/x2.csv") == "1\n2\n"
    assert sh(rich_env, "ls blobs") == "big.bin\nempty.txt\nname with space.txt\n"
    assert sh(rich_env, "stat -c %s blobs/empty.txt") == "0\n"
    sandbox = rich_env.sandbox
    assert sandbox is not None
    assert hashlib.sha256(sandbox.read_file("/srv/app/blobs/big.bin")).digest() == hashlib.sha256(BIG).digest()


def test_add_extracts_a_local_tarball(rich_env: envs.ShellEnv) -> None:
    """ADD of a local tar archive extracts it at the destination and leaves no staging file."""
    assert sh(rich_env, "cat /opt/bundle/inner/hello.txt") == "from the tarball\n"
    assert sh(rich_env, "ls -A /tmp | grep -c snapgym-add || true") == "0\n"


def test_run_steps_see_args_env_and_workdir(rich_env: envs.ShellEnv) -> None:
    """RUN (shell and exec form) runs in the WORKDIR with ARG and ENV values."""
    assert sh(rich_env, "cat made-by-run.txt csv-listing.txt") == "hi from /srv/app in test\nx1.csv\nx2.csv\n"


def test_apt_get_install_of_host_packages_builds(backend: LocalBackend, tmp_path: Path) -> None:
    """apt-get install of a package the host has translates to a build where apt-get is a no-op."""
    task = write_task(
        tmp_path,
        dockerfile="FROM snapgym/host\nWORKDIR /app\nRUN apt-get update && apt-get install -y coreutils "
        "&& echo installed > /app/apt.txt\n",
    )
    env = envs.ShellEnv(task, backend=backend)
    try:
        env.reset()
        assert sh(env, "cat apt.txt; test -e /.snapgym-build || echo no-shims") == "installed\nno-shims\n"
    finally:
        env.close()


@pytest.mark.parametrize("dest", [".", "/app"])
def test_copy_a_file_into_an_existing_directory_without_a_slash(
    backend: LocalBackend, tmp_path: Path, dest: str
) -> None:
    """COPY data.txt . (or the WORKDIR path) puts data.txt inside the directory, as Docker does."""
    task = write_task(
        tmp_path,
        dockerfile=f"FROM snapgym/host\nWORKDIR /app\nCOPY data.txt {dest}\n",
        context={"data.txt": "hello\n"},
    )
    env = envs.ShellEnv(task, backend=backend)
    try:
        env.reset()
        assert sh(env, "cat /app/data.txt") == "hello\n"
    finally:
        env.close()
