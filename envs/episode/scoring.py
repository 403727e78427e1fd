"""How an episode's end becomes a reward and its ``info``: the changes, the verdict, the network's share.

A verifier that could not run (the sandbox is gone, the backend failed) leaves no reward: the
episode is truncated and unscored, never counted as the agent's failure. A sandbox that ran out
of memory is the agent's doing and scores 0.0. Where the backend audits egress, a failure that
the network policy caused is unscored in strict verification and only a hint otherwise (the
agent's live processes share a sandbox with a ``shared`` verifier).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from envs.episode.network import NetworkFailure, failed_connections, network_failure
from envs.episode.taskset import Setup
from envs.tasks.protect import KnownGood
from envs.tasks.task import Task
from envs.tasks.verifier import Verdict, verify
from pool.capabilities import Capabilities, ChangesSource
from pool.changes import Changes
from pool.cluster.beside import run_beside
from pool.contract import Sandbox
from pool.errors import SandboxEndedError, SandboxError, SandboxOutOfMemoryError
from pool.snapshots import Snapshot
from pool.verification import VerifyMode

AGENT_ENDED = (SandboxOutOfMemoryError, SandboxEndedError)
"""How a sandbox's own processes end it during a step (out of memory; on a cloud backend, by ending
its entrypoint): the agent's doing, so the episode ends there and is verified and scored."""


def agents_end(exc: SandboxError) -> tuple[str, str]:
    """For an error of :data:`AGENT_ENDED`: what the observation says, and the episode's ``end_reason``."""
    if isinstance(exc, SandboxOutOfMemoryError):
        return "the sandbox ran out of memory", "out_of_memory"
    return "the sandbox ended", "sandbox_ended"


def changes_info(
    sandbox: Sandbox, capabilities: Capabilities, *, backend: str, own_paths: frozenset[str], before: Changes | None
) -> dict[str, Any]:
    """What the episode added, changed and removed against the task's snapshot, or ``{"unavailable": why}``.

    ``before``: the changes at the checkpoint a resumed episode went on from (the result is the whole episode's).
    """
    if capabilities.changes == ChangesSource.NONE:
        return {"unavailable": f"the {backend} backend cannot list them outside the sandbox"}
    try:
        changes = sandbox.changes().without(own_paths)
        if before is not None:
            changes = changes.after(before)
        return changes.as_dict()
    except SandboxError as exc:
        return {"unavailable": f"{type(exc).__name__}: {exc}"}


def judge(
    sandbox: Sandbox,
    task: Task,
    setup: Setup,
    *,
    known_good: Snapshot,
    env: Mapping[str, str],
    has_egress: bool,
    protection: KnownGood | None = None,
) -> Verdict:
    """The verifier's verdict on the sandbox's end state (no reward: the verifier could not run)."""
    mode = setup.verification
    try:
        # Beside the sandbox: a pooled one's verifier then costs one round trip, not six.
        verdict: Verdict = run_beside(
            sandbox, verify, task, mode=mode, known_good=known_good, env=dict(env),
            network=setup.network.verifier if has_egress else None, protection=protection,
        )  # fmt: skip
    except SandboxOutOfMemoryError as exc:  # shared: nothing left to verify beside; the agent's doing
        return Verdict(0.0, error=f"{exc} (scored 0.0)", mode=mode.value)
    except SandboxError as exc:
        return Verdict(None, error=f"{type(exc).__name__}: {exc}", mode=mode.value)
    return verdict


def record_network(sandbox: Sandbox, info: dict[str, Any], verdict: Verdict, setup: Setup) -> NetworkFailure | None:
    """Put the episode's connection attempts in ``info["network"]``; the network's share in a failure."""
    policy = setup.network.as_dict()
    try:
        log = sandbox.network_log()
    except SandboxError as exc:
        info["network"] = {"policy": policy, "error": f"{type(exc).__name__}: {exc}"}
        return None
    info["network"] = {"policy": policy, **log.as_dict()}
    failure = network_failure(log, verdict.reward)
    if verdict.reward is not None and verdict.reward <= 0.0 and (failed := failed_connections(log)):
        info["network_suspect"] = {
            "connections": list(failed),
            "note": "the verifier's connections failed: this 0.0 may be the environment's, not the agent's",
        }
    if failure is not None and setup.verification is not VerifyMode.STRICT:
        info["network_hint"] = failure.as_dict()  # the agent's live processes could have caused it
        return None
    return failure


def outcome(
    info: dict[str, Any], verdict: Verdict, failure: NetworkFailure | None, reason: str
) -> tuple[float, bool, bool]:
    """The end step's ``(reward, terminated, truncated)``, saying in ``info`` why one is unscored."""
    if verdict.reward is None:
        info["infra_error"] = f"verifier: {verdict.error}"
        return 0.0, False, True
    if failure is not None:
        info.update(scored=False, unscored_reason=failure.reason, network_failure=failure.as_dict())
        return 0.0, False, True
    return verdict.reward, reason == "submitted", reason != "submitted"
