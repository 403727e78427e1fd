"""What a backend does to a sandbox when its agent's turn ends and the verifier's begins.

The verifier's reward is only worth something if the agent cannot reach it
except through the task's outputs. ``sandbox.begin_verification(plan)`` is the
one call where a backend puts that boundary in place; the environments
(``envs.tasks.verifier``) decide which plan a task gets and read the verdict.

Three modes:

``strict``
    Every process of the agent is killed (and gone) before anything else.
    The verifier then runs in a fresh sandbox at the agent's start snapshot,
    with its own namespaces and resource budget, in which only the
    ``outputs`` paths show the agent's end state. Interpreters, the loader,
    shells, their configuration and everything else come from the known-good
    snapshot. A symbolic link in the outputs that would lead the verifier
    into its private paths (``/tests``, ``/logs/verifier``) is removed and
    reported.

``toolchain``
    Strict mode's separation, plus what the agent *added* where packages
    install (``pool.verification.installs``): the backend lists the agent's changes itself
    (its writable layer, which the agent cannot forge), and each path the
    known-good snapshot lacks under the install roots is shown to the
    verifier unless a rule of ``pool.verification.installs`` drops it (start-up hooks,
    shadows of known-good modules and commands, pytest plugins, upgrades of
    known-good distributions, ``/etc`` outside a package's own folder). A
    path the snapshot has, changed or not, is the snapshot's. What was
    grafted and dropped is in the report's ``install_delta``. Backends
    without an unforgeable change list do not offer the mode.

``shared``
    The agent's processes stay alive (a service the tests talk to) and the
    verifier sees the agent's whole filesystem, as in Harbor, except that
    each top-level directory holding one of the ``outputs`` is frozen: the
    verifier sees it as the agent's turn left it, so a process the agent left
    running cannot rewrite an answer, or swap it for a link to ``/tests``,
    while the tests read it (its sockets and FIFOs stay live, so the tests
    still reach a service through them). Private to the verifier:
    ``/tests`` and ``private_dirs`` (the reward channel), the top-level
    symbolic links (``/bin`` and friends) and the loader and shell
    configuration under ``/etc`` as the known-good snapshot had them. Links
    into the private paths are removed as in strict mode. The agent's
    processes cannot signal or trace the verifier's where the kernel offers
    Landlock scoping (``Capabilities.verifier_isolation``).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pool.errors import ConfigError
from pool.snapshots import Snapshot
from pool.validation import choose
from pool.verification.installs import InstallDelta


class VerifyMode(enum.Enum):
    """How the verifier is separated from the agent (see the module docstring)."""

    STRICT = "strict"
    TOOLCHAIN = "toolchain"
    SHARED = "shared"

    @property
    def is_separate(self) -> bool:
        """The verifier runs in a fresh sandbox at the known-good snapshot (strict and toolchain)."""
        return self is not VerifyMode.SHARED

    @classmethod
    def parse(cls, value: str | VerifyMode) -> VerifyMode:
        """A mode from its name (in any case); ConfigError lists the valid ones."""
        return choose(cls, value, what="verification mode", fold_case=True)


TESTS_PATH = "/tests"
"""Where the verifier's files appear."""
REWARD_DIR = "/logs/verifier"
"""The reward channel: a directory only the verifier's processes see."""

SHARED_SKELETONS = ("/etc", "/root")
"""shared: directories the verifier sees as private copies of the agent's (entries bound live) ..."""
SHARED_HOOKS = (
    # the loader
    "/etc/ld.so.preload", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/ld.so.cache",
    # shells and their environment
    "/etc/profile", "/etc/profile.d", "/etc/bash.bashrc", "/etc/bash.bash_logout", "/etc/environment",
    "/etc/inputrc", "/root/.bashrc", "/root/.bash_profile", "/root/.bash_login", "/root/.bash_logout",
    "/root/.profile", "/root/.inputrc",
    # Python (Debian's sitecustomize lives in /etc/python3.X), pip, git and download tools
    "/etc/python3", *(f"/etc/python3.{minor}" for minor in range(6, 16)), "/etc/pip.conf", "/etc/gitconfig",
    "/root/.local", "/root/.config", "/root/.pip", "/root/.pydistutils.cfg", "/root/.gitconfig",
    "/root/.npmrc", "/root/.curlrc", "/root/.wgetrc",
)  # fmt: skip
"""... except these, which come from the known-good snapshot (absent there: absent for the verifier).
``/root/.local`` is among them, so the verifier's user site-packages and ``~/.local/bin`` are the known-good ones."""


@dataclass(frozen=True, slots=True)
class VerificationPlan:
    """What the verifier's side of a sandbox looks like.

    Paths inside the sandbox are absolute and normalised; ``tests_dir`` is a
    folder on the host (the task's ``tests/``), shown as a writable copy at
    ``tests_path`` whose pristine content the agent never saw.
    """

    mode: VerifyMode
    tests_dir: Path
    """The host folder shown at ``tests_path``."""
    known_good: Snapshot | None = None
    """The snapshot the verifier trusts (the task's); None: the sandbox's start snapshot. An episode
    that started from a checkpoint still gets the task's: whatever the checkpoint holds is the agent's."""
    outputs: tuple[str, ...] = ()
    """The directories that show the agent's end state: strict, the only ones; shared, frozen (their
    top-level directories, outside ``/etc`` and ``/root``) while the rest stays live."""
    tests_path: str = TESTS_PATH
    private_dirs: tuple[str, ...] = (REWARD_DIR,)
    """Fresh, empty directories that only the verifier's processes see."""

    def __post_init__(self) -> None:
        for path in (*self.outputs, self.tests_path, *self.private_dirs):
            if (
                not path.startswith("/")
                or path == "/"
                or "\0" in path
                or any(part in ("", ".", "..") for part in path.strip("/").split("/"))
            ):
                raise ConfigError(f"verification paths must be absolute, normalised and not '/': {path!r}")
        if self.mode.is_separate and not self.outputs:
            raise ConfigError(f"a {self.mode.value} verification needs at least one output directory")
        private = (self.tests_path, *self.private_dirs)
        for out in self.outputs:
            for other in private:
                if _overlaps(out, other):
                    raise ConfigError(f"the output {out!r} overlaps the verifier's private {other!r}; pick another")


def outermost(paths: Sequence[str]) -> tuple[str, ...]:
    """The paths not inside another of them, sorted (what to copy or freeze once)."""
    kept: list[str] = []
    for path in sorted(set(paths)):
        if not any(path.startswith(k + "/") for k in kept):
            kept.append(path)
    return tuple(kept)


def _overlaps(a: str, b: str) -> bool:
    return a == b or a.startswith(b + "/") or b.startswith(a + "/")


@dataclass(frozen=True, slots=True)
class VerificationReport:
    """What the backend did when the verifier's turn began."""

    mode: VerifyMode
    removed_links: tuple[str, ...] = ()
    """Symbolic links the agent left (strict: in the outputs) that pointed into the verifier's private paths."""
    missing_outputs: tuple[str, ...] = ()
    """Outputs (shared: their top-level directories) that were not a directory in the agent's end state
    (shown empty)."""
    notes: tuple[str, ...] = field(default_factory=tuple)
    """Anything else the verifier should know, e.g. a protection this machine lacks."""
    install_delta: InstallDelta | None = None
    """toolchain: what the agent installed that the verifier got, and what it did not get, with why."""


MAX_LINK_HOPS = 40
"""Links followed in one resolution before giving up, as the kernel does (ELOOP)."""


def protected_tops(plan: VerificationPlan) -> frozenset[str]:
    """The top-level folders no link in the outputs may lead through (names, no slash).

    ``/proc``, ``/sys``, and the top-level folder of the tests folder and of each private
    directory (``/logs`` for ``/logs/verifier``): a link to ``/logs`` would reach the reward
    channel through the path the verifier appends. The C audit of the local and Docker
    backends (``pool/backends/csrc/linkaudit.c``) protects the same places.
    """
    return frozenset({"proc", "sys", *(p.strip("/").split("/")[0] for p in (plan.tests_path, *plan.private_dirs))})


def leads_into(
    link: str, target: str, protected: Iterable[str], links: Mapping[str, str | None]
) -> bool | tuple[str, ...]:
    """Whether following the link at ``link`` (an absolute path) to ``target`` passes through a protected folder.

    The link is followed as the kernel would from the verifier's root (at most
    :data:`MAX_LINK_HOPS` links; components that do not exist are taken as written), as in
    ``pool/backends/csrc/linkaudit.c``. ``links`` says what is known of the sandbox: a path's link
    target, or None when it is no link (or missing). When the answer needs a path it does not
    know, the paths to look up are returned instead (that one and those after it on the way, as
    written), to call again with them known.
    """
    tops = frozenset(protected)
    at = [] if target.startswith("/") else [p for p in link.split("/")[:-1] if p]
    todo = [p for p in target.split("/") if p]
    hops = 0
    while todo:
        part = todo.pop(0)
        if part == ".":
            continue
        if part == "..":
            at = at[:-1]
            continue
        at.append(part)
        if at[0] in tops:
            return True
        path = "/" + "/".join(at)
        if path not in links:
            rest = [c for c in todo if c not in (".", "..")] if ".." not in todo else []
            return (path, *("/" + "/".join(at + rest[: i + 1]) for i in range(len(rest))))
        followed = links[path]
        if followed is None:
            continue
        hops += 1
        if hops > MAX_LINK_HOPS:
            return False
        at = [] if followed.startswith("/") else at[:-1]
        todo = [p for p in followed.split("/") if p] + todo
    return False
