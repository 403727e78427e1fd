"""Reset latency: how long a dirty sandbox takes to get back to its snapshot.

Method:
    A template writes a deterministic workspace under ``/workspace``
    (default 1,000 files of ~50 KB, ~50 MB, drawn from ``random.Random(0)``).
    The host copy used by the naive baseline and the Docker image hold the
    same bytes; their digests are compared with the sandbox's before any
    timing. The build (cached by content hash) is not timed; ``build_s``
    reports it. Then, in one run and in this order:

    - ``exec_true``: ``sandbox.exec("true")`` on a clean sandbox.
    - ``restore``: before each iteration, untimed, one exec writes files in
      /tmp, /dev/shm and /workspace (a new file and an appended existing
      one) and leaves ``sleep 1000`` running in the background; only
      ``sandbox.restore()`` is timed. Afterwards the sandbox is checked to
      hold none of that and to have the snapshot's workspace digest.
      The local backend prepares the next episode's namespaces while the
      sandbox is in use, so this is the hand-off an episode boundary costs.
    - ``restore_immediate``: the same, but the untimed step before each
      iteration also restores, so the timed restore comes right after the
      previous one with no time for that preparation: the worst case.
    - ``create``: ``backend.create(snapshot)``; closing is untimed.
    - ``fork16``: ``backend.fork(snapshot, 16)``; closing the 16 is untimed.
    - ``verify_strict``, ``verify_shared``: the sandbox is dirtied as for
      ``restore``, then ``sandbox.begin_verification`` of a plan whose
      output is ``/workspace`` is timed (the hand-over from the agent's turn
      to the verifier's: strict kills the agent and grafts the outputs onto a
      fresh instance, shared freezes the outputs beside the live agent);
      the restore after it is untimed. Backends without verification skip.
    - ``naive_copy``: ``shutil.copytree`` of the host workspace into a new
      directory plus ``subprocess.run(["true"])``; deleting is untimed. The
      source sits warm in the page cache.
    - ``docker_recreate``: force-remove the (dirtied) container, create and
      start a new one from the image (see ``benchmarks.scenarios.baselines.docker``);
      skipped, with the reason, when no engine is reachable.
    - ``restore@NAME``, ``create@NAME`` for each backend NAME of
      ``other_backends`` other than the configured one (default: docker): the
      same workspace built on that backend (default options), then
      ``restore`` and ``create`` timed as above. On the Docker backend a
      restore hands over a pre-started spare container, so
      ``docker_recreate / restore@docker`` is what that hand-off saves over
      naive re-creation, and ``restore@docker / restore`` what the local
      backend saves over the Docker one.

    Each method first runs ``warmup`` iterations that are discarded, then its
    configured repetitions (0 skips it). The clock is ``time.perf_counter_ns``
    around the one call; the garbage collector stays on, as in real use.
    Per method: p50, p90, p99 (numpy, linear interpolation: below 100
    samples p99 is close to the maximum), mean and n, in milliseconds.
    Ratios divide a baseline's p50 by restore's p50.
"""

from __future__ import annotations

import dataclasses
import os
import platform
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from benchmarks.config import ResetLatencyConfig
from benchmarks.job import Job
from benchmarks.reports.report import Report, Skipped, Target
from benchmarks.reports.stats import percentile
from benchmarks.scenarios.baselines import docker as docker_baseline
from benchmarks.scenarios.baselines import naive as naive_baseline
from benchmarks.scenarios.measure import rootfs, workspace
from benchmarks.scenarios.measure.timing import measure
from pool import Backend, Sandbox, Snapshot, load_backend
from pool.backends import unavailable_reason
from pool.verification import VerificationPlan, VerifyMode

METHODS = (
    "restore",
    "restore_immediate",
    "create",
    "exec_true",
    "fork16",
    "verify_strict",
    "verify_shared",
    "naive_copy",
    "docker_recreate",
)
FORK_N = 16
DIRTY_COMMAND = (
    "echo dirty > /tmp/dirty && echo dirty > /dev/shm/dirty && echo dirty > /workspace/dirty"
    " && echo dirty >> /workspace/data/000/f00000.bin && (sleep 1000 </dev/null >/dev/null 2>&1 &)"
)
_CLEAN_CHECK = (
    "test ! -e /tmp/dirty && test ! -e /dev/shm/dirty && test ! -e /workspace/dirty"
    " && ! grep -qx sleep /proc/[0-9]*/comm"
)

Outcome = list[float] | Skipped


def run(job: Job) -> Report:
    """Measure every method of the scenario on the job's backend; see the module docstring."""
    cfg: ResetLatencyConfig = job.settings
    backend = job.backend
    _check_repetitions(cfg)
    snapshot, build_s = _build(backend, cfg)
    measured: dict[str, Outcome] = {}
    meta: dict[str, Any] = {"build_s": build_s, "snapshot": snapshot.id, "fork_n": FORK_N}
    with tempfile.TemporaryDirectory(prefix="snapgym-bench-", dir=cfg.naive_tmp_dir) as tmp:
        scratch = Path(tmp)
        host_workspace = scratch / "workspace"
        digest = workspace.materialize(cfg.workspace, host_workspace)
        meta["workspace"] = _describe_workspace(host_workspace, digest)
        meta["naive_copy_filesystem"] = naive_baseline.filesystem_type(scratch)
        measured.update(_sandbox_methods(cfg, backend, snapshot, digest))
        measured["create"] = _create(cfg, backend, snapshot)
        measured["fork16"] = _fork(cfg, backend, snapshot)
        measured["naive_copy"] = _naive(cfg, host_workspace, scratch)
        measured["docker_recreate"], meta["docker"] = _docker(cfg, host_workspace, scratch)
        others = [name for name in cfg.other_backends if name != backend.name]
        for name in others:
            measured.update(_other_backend(cfg, name, digest))
    meta.update(_environment(cfg, backend))
    methods = {name: measured[name] for name in METHODS}
    methods.update({f"{method}@{name}": measured[f"{method}@{name}"] for name in others for method in _OTHER})
    ratios = _ratios(methods)
    return Report("reset_latency", methods, ratios, _targets(cfg, methods, ratios), meta)


def _check_repetitions(cfg: ResetLatencyConfig) -> None:
    counts = {"warmup": cfg.warmup, **dataclasses.asdict(cfg.repetitions)}
    negative = {name: count for name, count in counts.items() if count < 0}
    if negative:
        raise ValueError(f"repetitions must be >= 0, got {negative}")


def _build(backend: Backend, cfg: ResetLatencyConfig) -> tuple[Snapshot, float]:
    started = time.perf_counter()
    snapshot = backend.build(workspace.template(cfg.workspace))
    return snapshot, time.perf_counter() - started


def _sandbox_methods(cfg: ResetLatencyConfig, backend: Backend, snapshot: Snapshot, digest: str) -> dict[str, Outcome]:
    sandbox = backend.create(snapshot)
    try:
        _require_digest(sandbox, digest, "the sandbox's workspace")
        exec_true = _timed(cfg, cfg.repetitions.exec_true, lambda: sandbox.exec("true"))
        restore = _timed(cfg, cfg.repetitions.restore, sandbox.restore, before=lambda: _dirty(sandbox))
        if not isinstance(restore, Skipped):
            _require_clean(sandbox, digest)

        def dirty_then_restore() -> None:
            _dirty(sandbox)
            sandbox.restore()

        immediate = _timed(cfg, cfg.repetitions.restore_immediate, sandbox.restore, before=dirty_then_restore)
        verify = {f"verify_{mode.value}": _verify(cfg, backend, sandbox, mode) for mode in _TIMED_MODES}
    finally:
        sandbox.close()
    return {"restore": restore, "restore_immediate": immediate, "exec_true": exec_true, **verify}


_TIMED_MODES = (VerifyMode.STRICT, VerifyMode.SHARED)
"""The verification modes timed (toolchain's seal is strict's plus a copy of the agent's layer: not timed yet)."""


def _verify(cfg: ResetLatencyConfig, backend: Backend, sandbox: Sandbox, mode: VerifyMode) -> Outcome:
    repetitions = getattr(cfg.repetitions, f"verify_{mode.value}")
    if mode.value not in backend.capabilities.verification:
        return Skipped(f"the {backend.name} backend has no {mode.value} verification")
    with tempfile.TemporaryDirectory(prefix="snapgym-bench-tests-") as tests:
        (Path(tests) / "test.sh").write_text("#!/bin/sh\necho 1 > /logs/verifier/reward.txt\n")
        plan = VerificationPlan(mode, Path(tests), outputs=(workspace.SANDBOX_ROOT,))
        return _timed(
            cfg,
            repetitions,
            lambda: sandbox.begin_verification(plan),
            before=lambda: _dirty(sandbox),
            after=lambda _report: sandbox.restore(),
        )


def _create(cfg: ResetLatencyConfig, backend: Backend, snapshot: Snapshot) -> Outcome:
    return _timed(cfg, cfg.repetitions.create, lambda: backend.create(snapshot), after=lambda s: s.close())


def _fork(cfg: ResetLatencyConfig, backend: Backend, snapshot: Snapshot) -> Outcome:
    return _timed(cfg, cfg.repetitions.fork16, lambda: backend.fork(snapshot, FORK_N), after=_close_all)


def _naive(cfg: ResetLatencyConfig, source: Path, scratch: Path) -> Outcome:
    reps = cfg.repetitions.naive_copy
    if reps == 0:
        return Skipped("0 repetitions configured")
    return naive_baseline.copy_latency(source, scratch, repetitions=reps, warmup=cfg.warmup)


def _docker(cfg: ResetLatencyConfig, host_workspace: Path, scratch: Path) -> tuple[Outcome, dict[str, Any]]:
    if not cfg.docker.enabled:
        return Skipped("disabled in the config (benchmark.docker.enabled=false)"), {}
    if cfg.repetitions.docker_recreate == 0:
        return Skipped("0 repetitions configured"), {}
    client = docker_baseline.connect()
    if isinstance(client, Skipped):
        return client, {}
    try:
        tarball = scratch / "rootfs.tar"
        userland = rootfs.build(tarball, host_workspace)
        info = {
            "engine": docker_baseline.engine_version(client),
            "userland": userland,
            "container": "/bin/sleep 1000 as PID 1, network_mode=none, stays up",
        }
        samples = docker_baseline.recreate_latency(
            client,
            tarball,
            repository=cfg.docker.repository,
            dirty_command=DIRTY_COMMAND,
            repetitions=cfg.repetitions.docker_recreate,
            warmup=cfg.warmup,
        )
    finally:
        client.close()
    return samples, info


_OTHER = ("restore", "create")


def _other_backend(cfg: ResetLatencyConfig, name: str, digest: str) -> dict[str, Outcome]:
    """restore and create of the same workspace on another backend, or why it was skipped."""
    reason = unavailable_reason(name)
    if reason is not None:
        return {f"{method}@{name}": Skipped(f"the {name} backend cannot run here: {reason}") for method in _OTHER}
    backend = load_backend(name)
    try:
        snapshot, _ = _build(backend, cfg)
        sandbox = backend.create(snapshot)
        try:
            _require_digest(sandbox, digest, f"the {name} sandbox's workspace")
            restore = _timed(cfg, cfg.repetitions.other_restore, sandbox.restore, before=lambda: _dirty(sandbox))
            if not isinstance(restore, Skipped):
                _require_clean(sandbox, digest)
        finally:
            sandbox.close()
        create = _timed(cfg, cfg.repetitions.other_create, lambda: backend.create(snapshot), after=lambda s: s.close())
    finally:
        backend.close()
    return {f"restore@{name}": restore, f"create@{name}": create}


def _timed(
    cfg: ResetLatencyConfig,
    repetitions: int,
    operation: Callable[[], object],
    *,
    before: Callable[[], object] | None = None,
    after: Callable[[Any], object] | None = None,
) -> Outcome:
    if repetitions == 0:
        return Skipped("0 repetitions configured")
    return measure(operation, repetitions=repetitions, warmup=cfg.warmup, before=before, after=after)


def _dirty(sandbox: Sandbox) -> None:
    result = sandbox.exec(DIRTY_COMMAND, timeout_s=30)
    if not result.ok:
        raise RuntimeError(f"dirtying the sandbox failed ({result.exit_code}): {result.stderr[-500:]}")


def _require_clean(sandbox: Sandbox, digest: str) -> None:
    result = sandbox.exec(_CLEAN_CHECK, timeout_s=30)
    if not result.ok:
        raise RuntimeError("after restore() the sandbox still holds files or processes of the last episode")
    _require_digest(sandbox, digest, "the workspace after restore()")


def _require_digest(sandbox: Sandbox, digest: str, what: str) -> None:
    result = sandbox.exec(workspace.digest_command(), timeout_s=120)
    if result.stdout.strip() != digest:
        raise RuntimeError(f"{what} differs from the host copy: {result.stdout.strip()!r} != {digest!r}")


def _close_all(sandboxes: Sequence[Sandbox]) -> None:
    for sandbox in sandboxes:
        sandbox.close()


def _ratios(methods: dict[str, Outcome]) -> dict[str, float | None]:
    restore = _p50(methods["restore"])
    docker, naive = _p50(methods["docker_recreate"]), _p50(methods["naive_copy"])
    ratios = {
        "restore_vs_docker": docker / restore if docker is not None and restore else None,
        "restore_vs_naive": naive / restore if naive is not None and restore else None,
    }
    if "restore@docker" in methods:
        docker_backend = _p50(methods["restore@docker"])
        ratios["docker_backend_restore_vs_recreate"] = (
            docker / docker_backend if docker is not None and docker_backend else None
        )
        ratios["restore_vs_docker_backend"] = docker_backend / restore if docker_backend and restore else None
    return ratios


def _targets(cfg: ResetLatencyConfig, methods: dict[str, Outcome], ratios: dict[str, float | None]) -> list[Target]:
    goal = cfg.targets

    def ceiling(method: str, q: int, limit: float) -> Target:
        outcome = methods[method]
        value = None if isinstance(outcome, Skipped) else percentile(outcome, q)
        return Target(f"{method}_p{q}_ms", f"{method} p{q} <= {limit:g} ms", limit, value)

    def speedup(baseline: str, limit: float) -> Target:
        key = f"restore_vs_{baseline}"
        return Target(key, f"restore >= {limit:g}x faster than {baseline}", limit, ratios[key], at_most=False)

    return [
        ceiling("restore", 50, goal.restore_p50_ms),
        ceiling("restore", 99, goal.restore_p99_ms),
        ceiling("exec_true", 50, goal.exec_true_p50_ms),
        ceiling("fork16", 50, goal.fork16_p50_ms),
        speedup("docker", goal.restore_vs_docker_min),
        speedup("naive", goal.restore_vs_naive_min),
    ]


def _p50(outcome: Outcome) -> float | None:
    return None if isinstance(outcome, Skipped) else percentile(outcome, 50)


def _describe_workspace(root: Path, digest: str) -> dict[str, Any]:
    sizes = [path.stat().st_size for path in root.rglob("*") if path.is_file()]
    return {"files": len(sizes), "bytes": sum(sizes), "digest": digest}


def _environment(cfg: ResetLatencyConfig, backend: Backend) -> dict[str, Any]:
    caps = backend.capabilities
    return {
        "backend": backend.name,
        "limits": {name: enforcement.value for name, enforcement in caps.limits.items()},
        "host": {"platform": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version()},
        "warmup": cfg.warmup,
        "repetitions": dataclasses.asdict(cfg.repetitions),
        "timer": "time.perf_counter_ns",
    }
