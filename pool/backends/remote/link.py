"""What a remote sandbox holds of its backend: the :class:`Link` (provider, pacer, worker threads, frozen options).

A :class:`~pool.backends.remote.sandbox.RemoteSandbox` does its own lifecycle
(hand-offs, spares, snapshots, verification) through its link; the backend
makes links and sandboxes and keeps the catalogue. The link's steps are the
ones the backend's builds share: a paced create, the start digest, a snapshot.

The start digest. A remote sandbox's bytes cannot be hashed from here, so a
snapshot's identity has two parts: the provider's snapshot reference (which
pins what the provider stored) and a digest snapgym computes *inside* the
sandbox over the snapshot's working directory (:data:`DIGEST_SCRIPT`: every
file's path, content and mode, every link's target, each entry's type; not
ownership, not the rest of the filesystem). It is computed when the snapshot
is made and again in every provider sandbox before it is handed to an
episode; a mismatch is a SnapshotCorruptError. ``Snapshot.digest`` is a hash
of both parts, ``Snapshot.layers`` holds them.

Bursts. Creations go through a token bucket shared by every process on the
machine that uses the same account, or of the Ray cluster
(:mod:`pool.backends.remote.ratelimit`), and a create refused for now is
retried with backoff under one idempotency key.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import hashlib
import random
import shlex
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from pool.backends.remote.options import RemoteOptions
from pool.backends.remote.provider import CreateRequest, Provider, ProviderImage
from pool.backends.remote.ratelimit import Limiter
from pool.errors import BackendError, BuildError, SnapshotCorruptError, SnapshotNotFoundError
from pool.resources import Resources
from pool.snapshots import Snapshot

PREFIX = "snapgym-"
WORKDIR_DIGEST = "workdir-sha256:"
DIGEST_SCRIPT = (
    "cd / && {{ find {p} -xdev -type f -print0 | sort -z | xargs -0r sha256sum; "
    "find {p} -xdev -print0 | sort -z | xargs -0r stat -c '%n %F %a'; "
    "find {p} -xdev -type l -print0 | sort -z | xargs -0r readlink; }} 2>/dev/null | sha256sum | cut -c1-64; "
    "read -r line < /proc/$$/stat && set -- ${{line##*) }} && echo ${{20}}"
)
"""What the in-sandbox digest runs (``{p}``: the quoted working directory). Its second line is the
start time of the digest's shell (clock ticks since the sandbox's boot): every process started
later is the agent's (see :class:`Started`)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Started:
    """A provider sandbox whose start digest was checked, ready to be handed to an episode."""

    remote: Any
    since_ticks: int
    """When the check ran, in the sandbox's clock ticks since boot (``/proc/PID/stat`` field 22): the
    processes started at or after it are the episode's, the ones before it the provider's."""


@dataclasses.dataclass(frozen=True, slots=True)
class Link:
    """A backend's provider, pace and threads, and the options a sandbox made now runs with."""

    name: str
    """The backend's name (``e2b``, ``daytona``, ``modal``)."""
    provider: Provider
    limiter: Limiter | None
    """The shared pace of creations (None: unpaced)."""
    workers: concurrent.futures.Executor
    """Threads for background creates and kills (shut down with the backend)."""
    options: RemoteOptions
    spare_max_age_s: float
    """A spare older than this is replaced rather than handed over (it would end under a long episode)."""
    forget: Callable[[str], None]
    """Drops a closed sandbox, by id, from its backend's catalogue."""

    def create(
        self, source: str | None, labels: Mapping[str, str], *, internet: bool = False,
        resources: Resources | None = None, image: ProviderImage | None = None,
    ) -> Any:  # fmt: skip
        """Create a provider sandbox, paced by the shared limiter; a refusal for now is retried with
        backoff under the same idempotency key, so a create whose answer was lost is not made twice."""
        request = CreateRequest(source, dict(labels), uuid.uuid4().hex, internet, resources, image)
        retries = self.options.create_retries
        for attempt in range(retries + 1):
            if self.limiter is not None:
                self.limiter.acquire()
            try:
                return self.provider.create(request)
            except BackendError:  # ProviderBusyError (429, 503) and other provider failures
                if attempt == retries:
                    raise
                time.sleep(min(30.0, 0.5 * 2**attempt) * random.uniform(0.5, 1.0))
        raise AssertionError("unreachable")

    def start(self, snapshot: Snapshot, labels: Mapping[str, str]) -> Started:
        """A new provider sandbox at ``snapshot``, its workdir digest checked."""
        remote = self.create(snapshot.layers[0], labels, resources=snapshot.resources)
        try:
            inside, since = self.probe(remote, snapshot.workdir)
            if f"{WORKDIR_DIGEST}{inside}" != snapshot.layers[1]:
                raise SnapshotCorruptError(
                    f"a {self.name} sandbox from snapshot {snapshot.id} ({snapshot.layers[0]}) has a working "
                    f"directory whose digest {inside[:16]} is not the recorded "
                    f"{snapshot.layers[1][len(WORKDIR_DIGEST) :][:16]}; the provider's snapshot changed: build again"
                )
        except BaseException:
            self.kill_later(remote)
            raise
        return Started(remote, since)

    def start_later(self, snapshot: Snapshot, labels: Mapping[str, str]) -> concurrent.futures.Future[Started]:
        """:meth:`start` on a background thread."""
        return self.workers.submit(self.start, snapshot, labels)

    def kill_later(self, remote: Any) -> None:
        """End a provider sandbox on a background thread, or here once the threads are shut down (a
        failure is left to its lifetime)."""

        def kill() -> None:
            with contextlib.suppress(Exception):
                self.provider.kill(remote)

        try:
            self.workers.submit(kill)
        except RuntimeError:  # the backend is closed: no more background work
            kill()

    def probe(self, remote: Any, workdir: str) -> tuple[str, int]:
        """(the digest of ``workdir`` inside a provider sandbox, the start time of the shell that computed it)."""
        result = self.provider.run(
            remote, DIGEST_SCRIPT.format(p=shlex.quote(workdir)), cwd="/", env={},
            timeout_s=self.options.request_timeout_s * 5, cap=4096,
        )  # fmt: skip
        lines = result.stdout.split()
        if result.exit_code != 0 or len(lines) != 2 or len(lines[0]) != 64 or not lines[1].isdigit():
            raise BuildError(f"the digest of {workdir} inside a {self.name} sandbox failed: {result.stderr[-500:]}")
        return lines[0], int(lines[1])

    def freeze(self, remote: Any, draft: Snapshot, name: str) -> Snapshot:
        """``draft`` recorded as a provider snapshot of ``remote`` named ``name-<workdir digest>``."""
        inside = self.probe(remote, draft.workdir)[0]
        reference = self.provider.make_snapshot(remote, f"{name}-{inside}")
        return recorded(draft, reference, inside)

    def snapshot_of(self, remote: Any, *, parent: Snapshot) -> Snapshot:
        """A mid-episode snapshot of a provider sandbox."""
        snapshot = self.freeze(remote, parent, f"{PREFIX}checkpoint-{uuid.uuid4().hex[:16]}")
        return dataclasses.replace(snapshot, id=snapshot.digest[:32], parent=parent.id, template=parent.template)

    def check(self, snapshot: Snapshot) -> None:
        """Refuse a snapshot that is not this backend's."""
        if snapshot.backend != self.name or len(snapshot.layers) != 2:
            raise SnapshotNotFoundError(
                f"snapshot {snapshot.id} was made by the {snapshot.backend!r} backend, not {self.name}"
            )


def recorded(draft: Snapshot, reference: str, inside: str) -> Snapshot:
    """``draft`` with the provider's ``reference`` and the ``inside`` digest as its identity."""
    digest = hashlib.sha256(f"{reference}\n{inside}".encode()).hexdigest()
    return dataclasses.replace(draft, digest=digest, layers=(reference, f"{WORKDIR_DIGEST}{inside}"))
