"""The image builds of the Daytona stand-in (tests/backends/cloud/daytona/standin.py): what a create with
``buildInfo`` (``CreateSandboxFromImageParams``) starts from. PYTEST_DONT_REWRITE.

As Daytona does, a build is named after its Dockerfile and context hashes (``daytona-<sha256>:daytona``,
the API's ``generateBuildInfoHash``) and made once: a create whose build exists takes it, one whose
build is under way waits for it, and a build that failed fails every create that asks for it. The
stand-in "builds" for real: the Dockerfile's ``FROM`` reference becomes a local template
(``pool.Template(base=reference)``), which the local backend fetches from its registry with skopeo
(so an image the registry lacks fails as a pull fails). Only ``FROM`` is built: a Dockerfile with
other instructions (the SDK's declarative ``Image`` steps) fails its build with that reason.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from pool import LocalBackend, Snapshot, Template


def build_ref(dockerfile: str, context_hashes: list[str] | None = None) -> str:
    """The name Daytona gives the build of ``dockerfile`` with those context hashes."""
    combined = dockerfile + "".join(sorted(context_hashes or []))
    return f"daytona-{hashlib.sha256(combined.encode()).hexdigest()}:daytona"


@dataclass(frozen=True, slots=True)
class BuildRecord:
    """One image build as the stand-in made it."""

    ref: str
    """``daytona-<sha256>:daytona``."""
    dockerfile: str
    image: str | None
    """The ``FROM`` reference (None: the Dockerfile has none)."""
    state: str
    """``building``, ``ready`` or ``error``."""
    error_reason: str | None
    logs: tuple[str, ...]
    local: Snapshot | None


@dataclass(slots=True)
class Build:
    ref: str
    dockerfile: str
    image: str | None
    state: str = "building"
    error_reason: str | None = None
    local: Snapshot | None = None
    logs: list[str] = field(default_factory=list)
    done: threading.Event = field(default_factory=threading.Event)

    def record(self) -> BuildRecord:
        return BuildRecord(
            self.ref, self.dockerfile, self.image, self.state, self.error_reason, tuple(self.logs), self.local
        )


class Builds:
    """The organisation's image builds, made on the local backend in background threads."""

    def __init__(self, backend: LocalBackend) -> None:
        self.backend = backend
        self._lock = threading.Lock()
        self._builds: dict[str, Build] = {}

    def request(
        self, dockerfile: str, context_hashes: list[str] | None, on_done: Callable[[Build], None]
    ) -> tuple[Build, bool]:
        """The build of ``dockerfile`` and whether it is new (started now); ``on_done`` runs once it is
        ready or failed (at once if it already is)."""
        ref = build_ref(dockerfile, context_hashes)
        with self._lock:
            build = self._builds.get(ref)
            fresh = build is None
            if build is None:
                build = self._builds[ref] = Build(ref, dockerfile, _from_image(dockerfile))
        if fresh:
            threading.Thread(target=self._build, args=(build,), name=f"daytona-build-{ref[8:20]}", daemon=True).start()

        def finish() -> None:
            build.done.wait()
            on_done(build)

        threading.Thread(target=finish, name=f"daytona-wait-{ref[8:20]}", daemon=True).start()
        return build, fresh

    def find(self, ref: str) -> Build | None:
        with self._lock:
            return self._builds.get(ref)

    def records(self) -> dict[str, BuildRecord]:
        """By ref."""
        with self._lock:
            return {ref: build.record() for ref, build in self._builds.items()}

    def log_lines(self, build: Build, *, follow: bool, timeout_s: float = 600.0) -> Iterator[bytes]:
        """The build's log, and with ``follow`` each line as it comes until the build ends."""
        sent, deadline = 0, time.monotonic() + timeout_s
        while True:
            finished = build.done.is_set()
            with self._lock:
                lines = build.logs[sent:]
            sent += len(lines)
            for line in lines:
                yield f"{line}\n".encode()
            if finished or not follow or time.monotonic() > deadline:
                return
            build.done.wait(0.1)

    def _build(self, build: Build) -> None:
        self._log(build, f"Building {build.ref}")
        extra = [
            line.split()[0] for line in _instructions(build.dockerfile) if line.split()[0].upper() not in ("FROM",)
        ]
        try:
            if build.image is None or extra:
                raise ValueError(
                    f"the stand-in builds only a Dockerfile of one FROM line; got {', '.join(extra) or 'no FROM'}"
                )
            self._log(build, f"Step 1/1 : FROM {build.image}")
            local = self.backend.build(Template(name=f"daytona-build-{build.ref[8:24]}", base=build.image))
        except Exception as exc:  # any failure is the build's, reported as Daytona reports it
            with self._lock:  # the pull's error, without the local backend's advice on providing images
                build.state, build.error_reason = "error", str(exc).split("; ", 1)[0]
            self._log(build, f"ERROR: {exc}")
        else:
            with self._lock:
                build.state, build.local = "ready", local
            self._log(build, f"Successfully built {build.ref}")
        build.done.set()

    def _log(self, build: Build, line: str) -> None:
        with self._lock:
            build.logs.append(line)


def _instructions(dockerfile: str) -> list[str]:
    lines = (line.strip() for line in dockerfile.replace("\\\n", " ").splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def _from_image(dockerfile: str) -> str | None:
    first = next(iter(_instructions(dockerfile)), "")
    words = first.split()
    if len(words) >= 2 and words[0].upper() == "FROM":
        return next((w for w in words[1:] if not w.startswith("--")), None)
    return None
