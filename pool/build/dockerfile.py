"""Turn a Dockerfile into build steps a backend runs in a sandbox over the ``FROM`` image.

A backend with its own image builder (Docker) builds a Dockerfile as it is; a
backend without one (the local backend) realises it with :func:`translate`
and :mod:`pool.build.images`: the ``FROM`` image's layers are the base, ``RUN``
steps run in a sandbox over them (with the build's network), ``COPY``/``ADD``
place build-context files, ``COPY --from=<image>`` copies out of another image.

Supported: one ``FROM`` (an image reference, mapped through the build's
``image_sources``; ``snapgym/host`` is the host userland), ``RUN`` (shell and
exec form), ``COPY``/``ADD`` of build-context files (``--chmod``, ``--chown``;
``ADD`` of a local tar archive extracts it), ``COPY --from=<image>``,
``WORKDIR``, ``ENV``, ``ARG``, ``SHELL``, ``HEALTHCHECK CMD`` and ``USER
root``. ``CMD``, ``ENTRYPOINT``, ``EXPOSE``, ``LABEL``, ``MAINTAINER``,
``STOPSIGNAL`` and ``VOLUME`` are ignored (an episode starts no service by
itself) and listed in ``notes``.

Rejected with a :class:`DockerfileError` naming the line: multi-stage builds
(a second ``FROM``, ``COPY --from=<stage>``), ``ADD`` from a URL, ``RUN``
heredocs and ``--mount``, a non-root ``USER``, ``ONBUILD``.

On the ``host`` base the sandbox sees the host's userland read-only, so:

- ``apt-get install`` is checked on the host when the task loads: every
  package must already be installed there (install it on the host, or build
  the task from its image); in the sandbox ``apt-get`` is then a no-op.
- ``pip install`` installs for the sandbox's root (``~/.local``, on PATH);
  a virtualenv works as usual. ``python -m pip install`` into the host
  interpreter and ``uv pip install --system`` fail: the interpreter is read-only.
- ``/usr`` (``/usr/local`` included) is the host's, read-only: a ``COPY`` there
  is rejected when the task loads, and a ``RUN`` that writes there fails the
  build. Use ``/opt``, or the task's own image.
"""

from __future__ import annotations

import json
import posixpath
import re
import shlex
import tarfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn

from pool.build.dockerlines import LITERAL_DOLLAR, apt_packages, expand, instructions
from pool.build.filesteps import mkdir_step, write_file_steps
from pool.build.hostpackages import missing_host_packages
from pool.build.hostview import DEFAULT_PATH
from pool.errors import DockerfileError, HostPackagesMissingError
from pool.templates import HOST_BASE, HOST_IMAGE, DockerBuild

BUILD_BIN = "/.snapgym-build/bin"
_HOST_READ_ONLY = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_IGNORED = {"CMD", "ENTRYPOINT", "EXPOSE", "LABEL", "MAINTAINER", "STOPSIGNAL", "VOLUME"}
_APT_SHIM = """#!/bin/sh
# snapgym: packages were checked on the host when the task loaded; the host userland provides them.
for arg in "$@"; do case "$arg" in
  update|install|clean|autoclean|autoremove|upgrade|dist-upgrade|remove|purge) exit 0;;
esac; done
echo "snapgym: apt-get $* is not supported on the host base" >&2; exit 100
"""
_PIP_SHIM = """#!/bin/sh
# snapgym: the host interpreter is read-only; outside a virtualenv, install for the sandbox's root.
if [ -z "$VIRTUAL_ENV" ] && [ "$1" = install ]; then
  shift; exec python3 -m pip install --user --break-system-packages "$@"
fi
exec python3 -m pip "$@"
"""


@dataclass(frozen=True, slots=True)
class ImageCopy:
    """``COPY --from=<image> SOURCE... DEST``: files out of another image, placed by the backend."""

    image: str
    """The image (after ``image_sources``), as a base spec the backend can fetch."""
    sources: tuple[str, ...]
    """Absolute paths in that image."""
    dest: str
    """Absolute destination in the sandbox."""
    into_dir: bool
    """Docker's rule: the destination is a folder (it ends in / or there are several sources)."""
    mode: int | None = None


Step = str | ImageCopy
"""A shell command run as root in the build sandbox, or a copy out of another image."""


@dataclass(frozen=True, slots=True)
class DockerfilePlan:
    """What a Dockerfile amounts to over its base."""

    image: str
    """The ``FROM`` image as written."""
    base: str
    """Where the start state begins: ``"host"``, a root filesystem path, or an image source."""
    steps: tuple[Step, ...]
    env: Mapping[str, str]
    """The environment of every exec: the base image's, then ``ENV``."""
    workdir: str | None
    """The last ``WORKDIR``; None when the Dockerfile sets none (the image's applies)."""
    healthcheck: str | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)
    runs_commands: bool = False
    """Whether any ``RUN`` step exists (only those may use the network, at build time)."""

    @property
    def images(self) -> tuple[str, ...]:
        """Every image the build needs: the base (unless it is the host) and the ``COPY --from`` ones."""
        found = [] if self.base == HOST_BASE else [self.base]
        found += [step.image for step in self.steps if isinstance(step, ImageCopy)]
        return tuple(dict.fromkeys(found))


def resolve_image(image: str, image_sources: Mapping[str, str]) -> str:
    """Where to get ``image``: its entry in ``image_sources`` (tagged, then untagged), the host
    for ``snapgym/host``, else the reference itself (fetched from its registry)."""
    untagged = re.sub(r":[^/:@]+$", "", image.split("@", 1)[0])
    for key in (image, untagged):
        if key in image_sources:
            return image_sources[key]
    return HOST_BASE if untagged in (HOST_IMAGE, HOST_BASE) else image


def translate(
    build: DockerBuild,
    *,
    base_env: Callable[[str], Mapping[str, str]] = lambda base: {},
    host_path: str = DEFAULT_PATH,
    extra_runs: Sequence[str] = (),
    host_has_packages: Callable[[list[str]], list[str]] = missing_host_packages,
) -> DockerfilePlan:
    """Translate a Dockerfile into a plan.

    Args:
        build: the Dockerfile and its build context.
        base_env: the environment a base starts with (an image's ``Env``), so that
            ``ENV PATH=/x:$PATH`` expands right; called once, at ``FROM``.
        host_path: PATH of the host base (the host interpreter's folder first).
        extra_runs: commands appended as ``RUN`` steps (a task's verifier setup).
        host_has_packages: returns the apt packages missing on the host.

    Raises:
        DockerfileError: an instruction is not supported; the message names the line.
        HostPackagesMissingError: a host-base ``apt-get install`` names packages the host lacks.
    """
    translator = _Translator(build, base_env, host_path, host_has_packages)
    return translator.run(build.dockerfile, extra_runs)


class _Translator:
    def __init__(
        self,
        build: DockerBuild,
        base_env: Callable[[str], Mapping[str, str]],
        host_path: str,
        missing: Callable[[list[str]], list[str]],
    ) -> None:
        self.path = build.path
        self.context = Path(build.context)
        self.sources = build.image_sources
        self.base_env = base_env
        self.host_path = host_path
        self.env: dict[str, str] = {}
        self.missing = missing
        self.args: dict[str, str] = {}
        self.workdir: str | None = None
        self.shell: list[str] | None = None
        self.steps: list[Step] = []
        self.notes: list[str] = []
        self.image: str | None = None
        self.stage: str | None = None
        self.base = HOST_BASE
        self.healthcheck: str | None = None
        self.runs_commands = False
        self.line = 0

    @property
    def cwd(self) -> str:
        return self.workdir or "/"

    def run(self, text: str, extra_runs: Sequence[str]) -> DockerfilePlan:
        steps = instructions(text) + [(0, "RUN", command) for command in extra_runs]
        for self.line, keyword, rest in steps:
            handler = getattr(self, f"do_{keyword.lower()}", None)
            if keyword in _IGNORED:
                self.notes.append(f"line {self.line}: {keyword} ignored (episodes start no service by themselves)")
            elif handler is None:
                self.fail(f"{keyword} is not supported")
            elif keyword != "FROM" and keyword != "ARG" and self.image is None:
                self.fail(f"{keyword} before FROM: a Dockerfile starts with FROM (no FROM instruction yet)")
            else:
                handler(rest)
        if self.image is None:
            self.fail("no FROM instruction")
        if self.base == HOST_BASE and any(isinstance(s, str) and f"export PATH={BUILD_BIN}:" in s for s in self.steps):
            self.steps.insert(0, self._shims())
            self.steps.append(f"rm -rf {posixpath.dirname(BUILD_BIN)}")
        return DockerfilePlan(
            image=self.image or "",
            base=self.base,
            steps=tuple(self.steps),
            env=dict(self.env),
            workdir=self.workdir,
            healthcheck=self.healthcheck,
            notes=tuple(self.notes),
            runs_commands=self.runs_commands,
        )

    def do_from(self, rest: str) -> None:
        words = [w for w in self.expand(rest).split() if not w.startswith("--platform")]
        if self.image is not None:
            self.fail("multi-stage builds (a second FROM) are not supported; COPY --from=<image> is")
        if not words:
            self.fail("FROM needs an image")
        self.image = words[0]
        if len(words) >= 3 and words[1].upper() == "AS":
            self.stage = words[2]
        self.base = resolve_image(self.image, self.sources)
        if self.base == HOST_BASE:
            self.env = {"PATH": f"/root/.local/bin:{self.host_path}"}
        else:
            self.env = {"PATH": DEFAULT_PATH, **self.base_env(self.base)}

    def do_arg(self, rest: str) -> None:
        for word in shlex.split(rest):
            name, _, default = word.partition("=")
            self.args.setdefault(name, self.expand(default))

    def do_env(self, rest: str) -> None:
        # Variables expand with the values from before this line, as Docker does
        # (in `ENV a=1 b=$a`, b gets the old a), and `\$` stays a literal dollar.
        before = {**self.args, **self.env}
        protected = rest.replace("\\$", LITERAL_DOLLAR)
        words = shlex.split(protected)
        if not words:
            self.fail("ENV needs a name and a value")
        if "=" not in words[0]:
            if len(words) < 2:
                self.fail(f"ENV {words[0]} has no value")
            value = protected.split(None, 1)[1]
            self.env[words[0]] = expand(value, before).replace(LITERAL_DOLLAR, "$")
            return
        for word in words:
            name, sep, value = word.partition("=")
            if not sep or not name:
                self.fail(f"ENV {word!r} has no value: write NAME=value")
            self.env[name] = expand(value, before).replace(LITERAL_DOLLAR, "$")

    def do_workdir(self, rest: str) -> None:
        target = self.expand(rest.strip())
        self.workdir = posixpath.normpath(posixpath.join(self.cwd, target))
        self.steps.append(mkdir_step(self.workdir))

    def do_user(self, rest: str) -> None:
        if self.expand(rest.strip()) not in ("root", "0", "0:0", "root:root"):
            self.fail(f"USER {rest.strip()}: only root is supported; the sandbox's root is unprivileged on the host")

    def do_shell(self, rest: str) -> None:
        self.shell = self.json_words(rest, "SHELL")

    def do_healthcheck(self, rest: str) -> None:
        words = rest.split()
        while words and words[0].startswith("--"):
            words.pop(0)
        if words and words[0].upper() == "NONE":
            self.healthcheck = None
        elif words and words[0].upper() == "CMD":
            command = rest[rest.upper().index("CMD") + 3 :].strip()
            self.healthcheck = (
                shlex.join(self.json_words(command, "HEALTHCHECK")) if command.startswith("[") else command
            )
        else:
            self.fail("HEALTHCHECK must be CMD ... or NONE")

    def do_onbuild(self, rest: str) -> None:
        self.fail("ONBUILD is not supported")

    def do_run(self, rest: str) -> None:
        rest = rest.strip()
        while rest.startswith("--"):
            flag, _, rest = rest.partition(" ")
            if flag.startswith("--mount"):
                self.fail("RUN --mount is not supported")
            rest = rest.lstrip()
        if rest.startswith("<<"):
            self.fail("RUN heredocs are not supported; put the script in a file and COPY it")
        command = shlex.join(self.json_words(rest, "RUN")) if rest.startswith("[") else rest
        if self.shell:
            command = shlex.join([*self.shell, command])
        self.runs_commands = True
        if self.base == HOST_BASE:
            self.check_apt(command)
        lines = [f"cd {shlex.quote(self.cwd)} || exit 1"]
        lines += [f"export {k}={shlex.quote(v)}" for k, v in {**self.args, **self.env}.items()]
        if self.base == HOST_BASE:
            lines.append(f"export PATH={BUILD_BIN}:$PATH")
        self.steps.append("\n".join([*lines, command]))

    def do_copy(self, rest: str) -> None:
        self.copy(rest, keyword="COPY")

    def do_add(self, rest: str) -> None:
        self.copy(rest, keyword="ADD")

    def copy(self, rest: str, *, keyword: str) -> None:
        words = self.json_words(rest, keyword) if rest.strip().startswith("[") else shlex.split(self.expand(rest))
        mode: int | None = None
        owner: str | None = None
        image: str | None = None
        while words and words[0].startswith("--"):
            flag, _, value = words.pop(0).partition("=")
            if flag == "--from" and keyword == "COPY":
                image = self.copy_from_image(value)
            elif flag == "--chmod":
                mode = self.octal(value)
            elif flag == "--chown":
                owner = value
            elif flag != "--link":
                self.fail(f"{keyword} {flag} is not supported")
        if len(words) < 2:
            self.fail(f"{keyword} needs a source and a destination")
        *sources, dest = words
        dest_abs = posixpath.normpath(posixpath.join(self.cwd, dest))
        if self.base == HOST_BASE and any(dest_abs == d or dest_abs.startswith(d + "/") for d in _HOST_READ_ONLY):
            self.fail(
                f"{keyword} into {dest_abs}: the host base shows the host's /usr read-only; "
                "copy to /opt or /app instead, or build the task from its own image"
            )
        into_dir = dest.endswith("/") or len(sources) > 1
        if image is not None:
            paths = tuple(posixpath.normpath(posixpath.join("/", source)) for source in sources)
            self.steps.append(ImageCopy(image, paths, dest_abs, into_dir, mode))
        else:
            self.copy_context(keyword, sources, dest_abs, into_dir, mode)
        if owner:
            self.steps.append(f"chown -R {shlex.quote(owner)} {shlex.quote(dest_abs)}")

    def copy_from_image(self, value: str) -> str:
        if not value:
            self.fail("COPY --from needs an image")
        if value == self.stage or value.isdigit():
            self.fail(f"COPY --from={value}: multi-stage builds are not supported; copy from an image instead")
        source = resolve_image(value, self.sources)
        if source == HOST_BASE:
            self.fail(f"COPY --from={value}: the host userland is not an image to copy from")
        return source

    def copy_context(self, keyword: str, sources: list[str], dest_abs: str, into_dir: bool, mode: int | None) -> None:
        for source in sources:
            if re.match(r"^[a-z]+://", source):
                self.fail(f"{keyword} from a URL is not supported; download it in a RUN step")
            for host_path in self.context_paths(source):
                if keyword == "ADD" and host_path.is_file() and tarfile.is_tarfile(host_path):
                    self.extract(host_path, dest_abs)
                elif host_path.is_dir():
                    self.copy_tree(host_path, dest_abs, mode)
                elif into_dir:
                    self.copy_file(host_path, posixpath.join(dest_abs, host_path.name), mode)
                else:
                    self.copy_file_or_into_dir(host_path, dest_abs, mode)

    def octal(self, value: str) -> int:
        try:
            return int(value, 8)
        except ValueError:
            self.fail(f"--chmod={value} is not an octal mode")

    def context_paths(self, pattern: str) -> list[Path]:
        root = self.context.resolve()
        matches = sorted(root.glob(pattern.lstrip("/"))) if any(c in pattern for c in "*?[") else [root / pattern]
        found = [m for m in matches if m.exists()]
        if not found:
            self.fail(f"{pattern!r} is not in the build context {self.context}")
        for match in found:
            if not match.resolve().is_relative_to(root):
                self.fail(f"{pattern!r} points outside the build context")
        return found

    def copy_tree(self, source: Path, dest: str, mode: int | None) -> None:
        self.steps.append(mkdir_step(dest))
        for item in sorted(source.rglob("*")):
            target = posixpath.join(dest, item.relative_to(source).as_posix())
            if item.is_dir():
                self.steps.append(mkdir_step(target))
            elif item.is_file():
                self.copy_file(item, target, mode)

    def copy_file_or_into_dir(self, source: Path, dest: str, mode: int | None) -> None:
        """Docker's rule: a destination that is an existing directory receives the file inside it."""
        staged = f"/tmp/.snapgym-copy-{len(self.steps)}"
        self.copy_file(source, staged, mode)
        inside = shlex.quote(posixpath.join(dest, source.name))
        target = shlex.quote(dest)
        parent = shlex.quote(posixpath.dirname(dest) or "/")
        self.steps.append(
            f"if [ -d {target} ]; then mv {staged} {inside}; else mkdir -p {parent} && mv {staged} {target}; fi"
        )

    def copy_file(self, source: Path, dest: str, mode: int | None) -> None:
        file_mode = mode if mode is not None else source.stat().st_mode
        self.steps.extend(write_file_steps(dest, source.read_bytes(), mode=file_mode))

    def extract(self, archive: Path, dest: str) -> None:
        staged = f"/tmp/.snapgym-add-{len(self.steps)}"
        self.steps.extend(write_file_steps(staged, archive.read_bytes()))
        self.steps.append(f"mkdir -p {shlex.quote(dest)} && tar -xf {staged} -C {shlex.quote(dest)} && rm -f {staged}")

    def check_apt(self, command: str) -> None:
        packages = apt_packages(command)
        if packages:
            missing = self.missing(packages)
            if missing:
                raise HostPackagesMissingError(
                    f"{self.path}:{self.line}: apt packages {', '.join(missing)} are not installed on this host, "
                    f"whose userland the 'host' base uses: install them on the host "
                    f"(apt-get install {' '.join(missing)}), or build the task from its own image "
                    f"instead of mapping {self.image!r} to the host",
                    missing,
                )

    def json_words(self, text: str, keyword: str) -> list[str]:
        try:
            words = json.loads(text)
        except json.JSONDecodeError:
            words = None
        if not isinstance(words, list) or not all(isinstance(w, str) for w in words):
            self.fail(f"{keyword} expects a JSON list of strings")
        return [self.expand(w) for w in words]

    def expand(self, text: str) -> str:
        return expand(text, {**self.args, **self.env})

    def _shims(self) -> str:
        steps = [*write_file_steps(f"{BUILD_BIN}/apt-get", _APT_SHIM.encode(), mode=0o755)]
        steps.append(f"ln -sf apt-get {BUILD_BIN}/apt")
        for name in ("pip", "pip3"):
            steps.extend(write_file_steps(f"{BUILD_BIN}/{name}", _PIP_SHIM.encode(), mode=0o755))
        return " && ".join(steps)

    def fail(self, why: str) -> NoReturn:
        where = f"{self.path}:{self.line}" if self.line else f"{self.path} (verifier setup)"
        raise DockerfileError(f"{where}: {why}")
