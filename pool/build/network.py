"""The build phase's network: how a template's setup and Dockerfile ``RUN`` steps reach out.

A template's build policy (``Template.network``, a :class:`~pool.egress.NetworkPolicy`) is
realised one of three ways, its :class:`BuildRoute`:

``none``
    The policy allows nothing: the build sandbox has loopback only.
``proxy``
    The build sandbox has loopback only and snapgym's egress proxy listens inside it, as in an
    episode: the proxy enforces the policy (allowlists, the always-refused non-global ranges
    and ports unless ``egress.trusted_networks`` lets them, SNI against the CONNECT host) and
    records every attempt. Tools that honour the proxy variables (apt, pip, uv, curl, git over
    https, npm) work; anything else (raw TCP, UDP, DNS) gets no route.
``direct``
    The backend's own network, neither filtered nor recorded (the host's network on a rootless
    local backend; the engine's bridge for the Docker engine's builder). Only a ``public``
    build policy may fall back to it, and the snapshot's record says so.

While the proxy serves a build it may write a CA bundle into the sandbox (extra CAs, the download
cache's CA); :func:`attached` removes it before the snapshot is taken, so the start state holds
nothing of the build's network. The record of what the build reached goes into the snapshot
(``Snapshot.build_network``) and, when a step fails, into the BuildError's message.
"""

from __future__ import annotations

import enum
import shlex
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from pool.contract import Sandbox
from pool.egress.sandboxside import CA_BUNDLE_PATH
from pool.errors import BuildError, UnsupportedError
from pool.network.audit import ALLOWED, NetworkLog, summarise
from pool.network.policy import NetworkMode, NetworkPolicy, Phase

_MAX_HOSTS = 200
"""Destinations kept per verdict in a snapshot's record (the counts are always complete)."""


class BuildRoute(enum.Enum):
    """How a build sandbox reaches the network (see the module docstring)."""

    NONE = "none"
    PROXY = "proxy"
    DIRECT = "direct"


def build_route(policy: NetworkPolicy, *, proxy_available: bool, why_not: str, backend: str) -> BuildRoute:
    """The route that realises ``policy`` on a backend.

    Raises:
        UnsupportedError: an allowlist where the proxy cannot serve the build (nothing else
            could enforce it); the message says what to do.
    """
    if not policy.allows_any:
        return BuildRoute.NONE
    if proxy_available:
        return BuildRoute.PROXY
    if policy.mode is NetworkMode.PUBLIC:
        return BuildRoute.DIRECT
    raise UnsupportedError(
        f"the {backend} backend cannot enforce the build network policy {policy.describe()}: {why_not}; "
        "build with network 'public' or 'no-network' (Template.network, or the run's network={'build': ...})"
    )


@dataclass(slots=True)
class BuildNetwork:
    """What a build's commands reached: filled in while :func:`attached` is active."""

    policy: NetworkPolicy
    route: BuildRoute
    log: NetworkLog = field(default_factory=NetworkLog)
    builder_route: BuildRoute | None = None
    """The route of the backend's own image builder, when one ran the Dockerfile's ``RUN`` steps
    before the recipe's steps (they are not in ``log``)."""

    def record(self) -> dict[str, Any]:
        """For the snapshot's record: the policy, the route, and the attempts summarised."""
        summary = summarise(self.log.connections)
        summary["hosts"] = {verdict: hosts[:_MAX_HOSTS] for verdict, hosts in summary["hosts"].items()}
        return {
            "policy": self.policy.as_dict(),
            "route": self.route.value,
            **({"builder_route": self.builder_route.value} if self.builder_route is not None else {}),
            **({"audit": {**summary, "dropped": self.log.dropped}} if self.route is BuildRoute.PROXY else {}),
        }

    def refusals(self) -> str:
        """``"; the network refused: host:port (rule), ..."`` for a failed step's message, or ``""``."""
        failed = [c for c in self.log.connections if c.verdict != ALLOWED]
        if not failed:
            return ""
        listed = dict.fromkeys(f"{c.host}:{c.port} ({c.verdict}: {c.error or c.rule})" for c in failed)
        shown = list(listed)[:10]
        more = f" and {len(listed) - len(shown)} more" if len(listed) > len(shown) else ""
        return (
            f"\n--- build network ({self.policy.describe()}) refused or could not reach ---\n"
            + "\n".join(shown)
            + more
            + "\n(allow these hosts in the build policy, or egress.trusted_networks for a private mirror)"
        )


@contextmanager
def attached(sandbox: Sandbox, network: BuildNetwork) -> Iterator[BuildNetwork]:
    """Serve the build's commands through the egress proxy for the duration (route ``proxy`` only).

    On the way out the policy turns to no-network, the attempts land in ``network.log``, and a CA
    bundle the proxy wrote is removed. A BuildError raised inside gets the refused attempts added
    to its message (a step that failed for want of a host says which).
    """
    if network.route is BuildRoute.NONE:
        try:
            yield network
        except BuildError as exc:
            raise BuildError(
                f"{exc}\n(the build had no network: its policy is no-network; a step that downloads needs the "
                "build policy public or an allowlist)"
            ) from exc
        return
    if network.route is BuildRoute.DIRECT:
        yield network
        return
    had_folder = sandbox.exec(f"test -e {shlex.quote(_folder(CA_BUNDLE_PATH))}", timeout_s=60).ok
    environment = sandbox.set_network(network.policy, phase=Phase.BUILD)
    try:
        yield network
    except BuildError as exc:
        network.log = network.log + sandbox.network_log()
        raise BuildError(f"{exc}{network.refusals()}") from exc
    finally:
        sandbox.set_network(NetworkPolicy.offline(), phase=Phase.BUILD)
    network.log = network.log + sandbox.network_log()
    if "SSL_CERT_FILE" in environment:
        tidy = f"rm -f {shlex.quote(CA_BUNDLE_PATH)}"
        if not had_folder:
            tidy += f" && rmdir {shlex.quote(_folder(CA_BUNDLE_PATH))}"
        result = sandbox.exec(tidy, timeout_s=60, cwd="/")
        if not result.ok:
            raise BuildError(f"removing the build's CA bundle {CA_BUNDLE_PATH} failed: {result.stderr[-500:]}")


def _folder(path: str) -> str:
    return path.rsplit("/", 1)[0] or "/"
