"""The local backend's side of ``sandbox.begin_verification``: what the daemon is told, and what it says back.

The mechanism lives in the daemon (``sandboxd/verifier/graft.c`` for strict,
``sandboxd/verifier/shared.c`` for shared, ``sandboxd/keeper/keeper.c`` for the hand-over); this
module turns a :class:`~pool.verification.VerificationPlan` into the fields of
one ``SEAL`` request and the daemon's reply into a
:class:`~pool.verification.VerificationReport`. The task's tests become a
stored layer (content-addressed, owned by the sandbox's root) the first time
they are used, so a verification copies nothing. A ``toolchain`` verifier also
gets the agent's installs grafted as a layer (:func:`graft_installs`).
"""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

from pool.backends.local.instance import graftlayer
from pool.backends.local.settings import LocalSettings
from pool.backends.local.store import layers
from pool.backends.local.store.catalogue import SnapshotStore
from pool.errors import ConfigError, UnsupportedError
from pool.snapshots import Snapshot
from pool.templates import HOST_BASE
from pool.verification import (
    SHARED_HOOKS,
    SHARED_SKELETONS,
    VerificationPlan,
    VerificationReport,
    VerifyMode,
)
from pool.verification.installs import InstallDelta

Fields = list[tuple[str, str]]


def refuse_resumed_toolchain(start: Snapshot, known_good: Snapshot) -> None:
    """Refuse toolchain verification of an episode resumed from a checkpoint over ``known_good``.

    Raises:
        UnsupportedError: ``start`` is a checkpoint (what the agent installed before it is in its layers).
    """
    if agent_layers(start, known_good):
        raise UnsupportedError(
            "toolchain verification of an episode resumed from a checkpoint is not built yet (what the agent "
            "installed before the checkpoint is in the checkpoint's layers); verify it in strict mode"
        )


def graft_installs(
    store: SnapshotStore,
    settings: LocalSettings,
    start: Snapshot,
    known_good: Snapshot,
    *,
    known_good_layers: list[Path],
    upper: Path,
    pause: Callable[[], None],
    resume: Callable[[], None],
) -> tuple[Path | None, InstallDelta]:
    """A toolchain verifier's graft of the agent's installs (see pool.backends.local.instance.graftlayer).

    Args:
        start: the snapshot the agent's sandbox started from.
        known_good: the trusted snapshot (checked by the caller), with its layer directories, bottom first.
        upper: the agent's writable layer.
        pause: stops the agent's processes before the copy.
        resume: restarts them after it.

    Raises:
        UnsupportedError: ``start`` is a checkpoint (see :func:`refuse_resumed_toolchain`).
    """
    refuse_resumed_toolchain(start, known_good)
    return graftlayer.build(
        store,
        upper,
        known_good_layers,
        host=settings.host if known_good.base == HOST_BASE else None,
        path=known_good.env.get("PATH") or settings.host.path_env,
        rootless=settings.rootless,
        max_mb=max(settings.max_snapshot_mb, known_good.resources.storage_mb or 0),
        pause=pause,
        resume=resume,
    )


def agent_layers(start: Snapshot, known_good: Snapshot) -> tuple[str, ...]:
    """The layers of ``start`` above ``known_good``'s: what a checkpoint added (the agent's work).

    Raises:
        ConfigError: ``start`` is neither ``known_good`` nor a checkpoint taken over it.
    """
    base = tuple(known_good.layers)
    if start.base != known_good.base or tuple(start.layers[: len(base)]) != base:
        raise ConfigError(
            f"the sandbox started from snapshot {start.id}, which is not {known_good.id} or a checkpoint of it; "
            "verify against the snapshot the episode started from"
        )
    return tuple(start.layers[len(base) :])


def seal_fields(
    plan: VerificationPlan,
    *,
    known_good: Sequence[Path],
    agent: Sequence[Path],
    tests_layer: Path,
) -> Fields:
    """The SEAL request's own fields (the strict verifier's instance also gets the known-good config).

    Args:
        plan: what the verifier's side looks like.
        known_good: the trusted snapshot's layer directories, bottom first.
        agent: the layers the agent's checkpoints added above them, bottom first.
        tests_layer: the stored layer holding the task's tests.
    """
    daemon_mode = VerifyMode.STRICT if plan.mode.is_separate else plan.mode  # toolchain: strict, over more layers
    fields: Fields = [("seal", daemon_mode.value), ("tests_lower", str(tests_layer)), ("tests_at", plan.tests_path)]
    fields += [("private", path) for path in plan.private_dirs]
    fields += [("output", path) for path in plan.outputs]
    fields += [("agent_layer", str(path)) for path in reversed(agent)]  # top first
    if plan.mode.is_separate:
        return fields
    fields += [("known_good", str(path)) for path in reversed(known_good)]  # top first
    fields += [("skeleton", path) for path in SHARED_SKELETONS]
    fields += [("hook", path) for path in SHARED_HOOKS]
    return fields


def parse_report(mode: VerifyMode, reply: dict[str, str], delta: InstallDelta | None = None) -> VerificationReport:
    """What the daemon did, from its reply's ``removed`` and ``missing`` lines (and the install delta grafted)."""
    removed = tuple(" -> ".join(entry.split("\x1f", 1)) for entry in reply.get("removed", "").split("\n") if entry)
    missing = tuple(path for path in reply.get("missing", "").split("\n") if path)
    return VerificationReport(mode=mode, removed_links=removed, missing_outputs=missing, install_delta=delta)


class TestsLayers:
    """The task tests folders this backend has stored as layers (by folder and content)."""

    def __init__(self, store: SnapshotStore, *, id_offset: int) -> None:
        self._store = store
        self._id_offset = id_offset
        self._lock = threading.Lock()
        self._known: dict[tuple[str, str], str] = {}

    def layer_for(self, tests_dir: Path) -> Path:
        """The stored layer that holds ``tests_dir`` at its root (made on first use).

        Raises:
            ConfigError: the folder is missing or holds something other than
                files, folders and links.
        """
        key = (os.path.realpath(tests_dir), _listing_key(tests_dir))
        with self._lock:
            layer_id = self._known.get(key)
            if layer_id is None or not self._store.layers.exists(layer_id):
                layer_id = self._import(tests_dir)
                self._known[key] = layer_id
        self._store.layers.verify(layer_id)  # once per process: the tests are served like any layer
        return self._store.layers.path(layer_id)

    def _import(self, tests_dir: Path) -> str:
        with self._store.layers.staging("storing a task's tests") as staged:
            shutil.copytree(tests_dir, staged, symlinks=True, dirs_exist_ok=True)
            for path in staged.rglob("*"):
                if not (path.is_symlink() or path.is_dir() or path.is_file()):
                    raise ConfigError(f"{tests_dir}: {path.relative_to(staged)} is not a file, folder or link")
            os.chmod(staged, 0o755)
            layers.shift_owners(staged, self._id_offset)
            layer_id, _ = self._store.layers.commit(staged)
        return layer_id


def _listing_key(folder: Path) -> str:
    """Every entry under ``folder`` (links not followed: the layer keeps them as links) with its size, time and
    mode: a change to the tests makes another key. Read with ``os.scandir`` (once per seal: about a quarter of
    ``Path.rglob``'s time for a small folder)."""
    if not folder.is_dir():
        raise ConfigError(f"the tests folder {folder} does not exist")
    entries: list[str] = []
    pending = [("", str(folder))]
    while pending:
        prefix, path = pending.pop()
        with os.scandir(path) as listing:
            for entry in listing:
                st = entry.stat(follow_symlinks=False)
                name = prefix + entry.name
                entries.append(f"{name}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_mode}")
                if entry.is_dir(follow_symlinks=False):
                    pending.append((name + "/", entry.path))
    entries.sort()
    return "\n".join(entries)
