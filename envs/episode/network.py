"""An episode's network: the task's policy per phase, a run's override, and when a failed
verification is the network's fault rather than the agent's.

The task's policies come from task.toml as Harbor defines them (see
:mod:`envs.tasks.taskconfig`); a run may override them for every task
(``network="offline"`` for reproducible RL, ``"public"``, a list of hosts, a
:class:`~pool.egress.NetworkPolicy`, or ``{"build": ..., "agent": ..., "verifier": ...}``).
A plain value sets the episode's phases, agent and verifier; the build (the
template's setup and Dockerfile ``RUN`` steps, public as in Harbor) changes
only when the mapping names it, and then the task's template becomes another
snapshot (:func:`template_for`).

Attribution. A verifier that could not download what its test script needs
(denied by the policy, or allowed but unreachable from an offline machine)
scores 0.0 through no fault of the agent's. Such an episode is reported as
unscored (``network_denied`` / ``network_unreachable``) when the verification
was strict, failed (reward 0.0), and **the verifier's first connection
attempt** failed. Only the first counts because the tests run the agent's
code later, and a policy that wanted to hide a failure could otherwise make
that code try a forbidden host on purpose. In shared verification the
agent's own processes are alive while the tests run and could make that first
attempt, so there the episode keeps its 0.0 and ``info["network_hint"]`` says
what the network refused. A replay of the download cache (``egress.cache``,
:mod:`pool.egress.cache`) refuses a request it has no recording of with the rule
``replay miss: URL``: ``network_denied`` too, with a hint naming the URL.

Never a silent 0. A later attempt that fails (the verifier's ``apt-get update`` works, then its
``uv`` download is unreachable, or the proxy answers 502) does not make the episode unscored, for
the reason above; but the 0.0 is not silent either: the episode stays scored and
``info["network_suspect"]`` lists the verifier's connections that did not get through
(:func:`failed_connections`), which the runner counts per task in its summary. The agent gains
nothing by causing one: its score stays 0.0.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from pool.errors import ConfigError
from pool.network.audit import DENIED, REPLAY_MISS, UNREACHABLE, NetworkLog
from pool.network.policy import NetworkPolicy, Phase, PhasePolicies
from pool.templates import Template

NETWORK_DENIED = "network_denied"
NETWORK_UNREACHABLE = "network_unreachable"
NetworkSetting = str | NetworkPolicy | PhasePolicies | Mapping[str, Any] | Sequence[str] | None
"""What a run may say about the network (see :func:`effective_policies`)."""


def effective_policies(task: PhasePolicies, setting: NetworkSetting) -> PhasePolicies:
    """The policies an episode runs under: the task's (``None`` or ``"task"``), or the run's override."""
    if setting is None or setting == "task":
        return task
    if isinstance(setting, PhasePolicies):
        return setting
    if isinstance(setting, Mapping) and set(setting) <= {"build", "agent", "verifier"} and setting:
        return PhasePolicies(
            agent=_policy(setting.get("agent", "task"), task.agent),
            verifier=_policy(setting.get("verifier", "task"), task.verifier),
            build=_policy(setting.get("build", "task"), task.build),
        )
    policy = _policy(setting, None)
    return PhasePolicies(agent=policy, verifier=policy, build=task.build)


def template_for(template: Template, policies: PhasePolicies) -> Template:
    """``template`` built under the build policy of ``policies`` (itself when that is its own)."""
    if template.network == policies.build:
        return template
    return replace(template, network=policies.build)


def _policy(value: Any, task: NetworkPolicy | None) -> NetworkPolicy:
    if value == "task" and task is not None:
        return task
    try:
        return NetworkPolicy.parse(value)
    except (ConfigError, TypeError) as exc:
        raise ConfigError(
            f"network: {exc}; give 'task', 'offline', 'public', a list of allowed hosts, or "
            "{'build': ..., 'agent': ..., 'verifier': ...}"
        ) from None


def describe_difference(task: PhasePolicies, effective: PhasePolicies) -> str | None:
    """``"agent: no-network (task: public); verifier: ..."`` for the phases the run changed, or None."""
    changed = [
        f"{phase.value}: {mine.describe()} (task: {theirs.describe()})"
        for phase in (Phase.BUILD, Phase.AGENT, Phase.VERIFIER)
        if (mine := effective.for_phase(phase)) != (theirs := task.for_phase(phase))
    ]
    return "; ".join(changed) or None


def modes_needed(policies: PhasePolicies) -> set[str]:
    """The network modes an episode under these policies needs its backend to enforce."""
    return {policies.agent.mode.value, policies.verifier.mode.value}


@dataclass(frozen=True, slots=True)
class NetworkFailure:
    """Why a failed verification is blamed on the network, and what would let the task run."""

    reason: str
    """:data:`NETWORK_DENIED` or :data:`NETWORK_UNREACHABLE`."""
    hosts: tuple[str, ...]
    """``host:port`` of every verifier attempt that failed."""
    hint: str

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready fields."""
        return {"reason": self.reason, "hosts": list(self.hosts), "hint": self.hint}


def failed_connections(log: NetworkLog) -> tuple[str, ...]:
    """The verifier's connection attempts that did not get through, as ``host:port (verdict: why)``:
    refused, unreachable, or allowed but failed on the way (the upstream's error, a cut transfer)."""
    return tuple(
        dict.fromkeys(
            f"{c.host}:{c.port} ({c.verdict}: {c.error or c.rule})"
            for c in sorted(log.connections, key=lambda c: c.time)
            if c.phase == Phase.VERIFIER.value and (c.verdict in (DENIED, UNREACHABLE) or c.error)
        )
    )


def reached_hosts(log: NetworkLog) -> tuple[str, ...]:
    """``host:port`` of the verifier's connection attempts that got through, without an error."""
    return tuple(
        dict.fromkeys(
            f"{c.host}:{c.port}"
            for c in sorted(log.connections, key=lambda c: c.time)
            if c.phase == Phase.VERIFIER.value and c.verdict not in (DENIED, UNREACHABLE) and not c.error
        )
    )


def network_failure(log: NetworkLog, reward: float | None) -> NetworkFailure | None:
    """The network's share in a failed verification (see the module docstring), or None."""
    if reward is None or reward > 0.0:
        return None
    attempts = sorted((c for c in log.connections if c.phase == Phase.VERIFIER.value), key=lambda c: c.time)
    if not attempts or attempts[0].verdict not in (DENIED, UNREACHABLE):
        return None
    failed = tuple(dict.fromkeys(f"{c.host}:{c.port}" for c in attempts if c.verdict in (DENIED, UNREACHABLE)))
    if attempts[0].verdict == DENIED and attempts[0].rule.startswith(REPLAY_MISS):
        hint = (
            f"the download cache (egress.cache, mode replay) has no recorded response for "
            f"{attempts[0].rule.removeprefix(REPLAY_MISS)}; record it (mode record, with the network) or "
            "import a cache that has it"
        )
        return NetworkFailure(NETWORK_DENIED, failed, hint)
    if attempts[0].verdict == DENIED:
        hint = (
            f"the verifier's policy refused {', '.join(failed)} ({attempts[0].rule}); run with network='task' "
            "if the run overrides it, or allow these hosts for the verifier (network='public' or an allowlist)"
        )
        return NetworkFailure(NETWORK_DENIED, failed, hint)
    hint = (
        f"the verifier could not reach {', '.join(failed)} ({attempts[0].error or 'unreachable'}); this machine "
        "may be offline: give the backend an upstream proxy (egress.upstream_proxy) or install what test.sh "
        "downloads at build time"
    )
    return NetworkFailure(NETWORK_UNREACHABLE, failed, hint)
