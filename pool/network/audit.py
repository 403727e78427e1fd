"""The audit of a sandbox's network: one record per connection attempt, allowed or not, and one
per call to a model route."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

ALLOWED = "allowed"
"""The policy allowed the destination and the proxy reached it."""
DENIED = "denied"
"""The policy (or a rule that holds whatever the policy: private ranges, SNI) refused it."""
UNREACHABLE = "unreachable"
"""The policy allowed it but it could not be reached (no such name, refused, timed out, upstream down)."""
INVALID = "invalid"
"""The client did not speak HTTP proxy protocol (nothing was reached)."""
REPLAY_MISS = "replay miss: "
"""The rule of a request the download cache, replaying, has no recording of (the URL follows)."""


@dataclass(frozen=True, slots=True)
class Connection:
    """One attempt to reach something through snapgym's egress proxy."""

    time: float
    """When the attempt began (Unix time, seconds)."""
    phase: str
    """"agent" or "verifier"."""
    kind: str
    """"connect" (HTTP CONNECT: TLS or any TCP) or "http" (a plain HTTP request)."""
    host: str
    """The host the client asked for (a name or an address literal)."""
    port: int
    verdict: str
    """:data:`ALLOWED`, :data:`DENIED`, :data:`UNREACHABLE` or :data:`INVALID`."""
    rule: str
    """What decided: the policy (``"public"``, ``"no-network"``, ``"allowlist:*.pypi.org"``,
    ``"allowlist:no match"``) or a rule that holds whatever the policy (``"non-global address 10.0.0.3"``,
    ``"non-global name localhost"``, ``"denied port 6379"``, ``"sni-mismatch: NAME"``,
    ``"host-mismatch: NAME"``, ``"unreadable opening: ..."``, ``"unreadable TLS ClientHello: ..."``,
    ``"too many connections"``, ``"invalid request"``, ``"replay miss: URL"``)."""
    address: str | None = None
    """The address the proxy connected (or would have connected) to."""
    sni: str | None = None
    """The TLS server name the client sent after CONNECT, when it sent one."""
    url: str | None = None
    """For plain HTTP: the method and URL (capped)."""
    bytes_up: int = 0
    """Bytes from the sandbox to the destination (after the proxy's handshake)."""
    bytes_down: int = 0
    """Bytes from the destination to the sandbox."""
    duration_s: float = 0.0
    error: str | None = None
    """Why an unreachable or invalid attempt failed, or why an allowed one ended early (``"cut: the
    policy changed"``, ``"cut: the gate closed"``, ``"idle timeout"``, ``"proxy error: TYPE"``, ...)."""
    cache: str | None = None
    """What the download cache did, while it is on (:mod:`pool.egress.cache`): ``"hit"`` (answered from
    the store), ``"stored"`` (fetched and stored), ``"passed"`` (fetched, not stored: credentials, over the
    size cap, not HTTP), ``"miss"`` (a replay without a stored answer, or with a corrupt one); None when
    the cache is off or the connection never got to it. Of several requests on one connection, the
    most telling (miss, stored, passed, hit)."""

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready fields."""
        return asdict(self)


@dataclass(frozen=True, slots=True)
class ModelCall:
    """One request an agent made to a model route through the gateway (see pool.egress.models.routes)."""

    time: float
    """When the request arrived (Unix time, seconds)."""
    route: str
    """The route's name."""
    method: str
    path: str
    """The path the agent asked for (capped; without the query)."""
    verdict: str
    """:data:`ALLOWED` (forwarded; ``status`` is the upstream's), :data:`DENIED` (a path, method or size
    the route refuses, or its call cap), :data:`UNREACHABLE` (the upstream could not be reached or
    did not answer in time) or :data:`INVALID`."""
    status: int
    """The HTTP status the agent got."""
    model: str | None = None
    """The ``model`` the request named."""
    input_tokens: int | None = None
    output_tokens: int | None = None
    cached_input_tokens: int | None = None
    bytes_up: int = 0
    """Request body bytes forwarded."""
    bytes_down: int = 0
    """Reply body bytes returned."""
    duration_s: float = 0.0
    error: str | None = None
    """Why it was denied or failed (``"path not allowed"``, ``"call cap 2000 reached"``, ``"upstream: ..."``)."""
    tokens: dict[str, Any] | None = None
    """On a route with ``capture_tokens``: the call's token ids, log-probabilities and model version, or why
    there are none (``pool.egress.models.tokens.TokenCapture.as_dict``); None on other routes."""

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready fields."""
        return asdict(self)


def summarise_model_calls(calls: Iterable[ModelCall]) -> dict[str, Any]:
    """Calls per verdict and the tokens they used, in total and per route."""
    items = list(calls)
    per_route: dict[str, dict[str, int]] = {}
    for call in items:
        totals = per_route.setdefault(call.route, {"calls": 0, "input_tokens": 0, "output_tokens": 0})
        totals["calls"] += 1
        totals["input_tokens"] += call.input_tokens or 0
        totals["output_tokens"] += call.output_tokens or 0
    return {
        "calls": len(items),
        **{verdict: sum(c.verdict == verdict for c in items) for verdict in (ALLOWED, DENIED, UNREACHABLE, INVALID)},
        "input_tokens": sum(c.input_tokens or 0 for c in items),
        "output_tokens": sum(c.output_tokens or 0 for c in items),
        "routes": per_route,
    }


def summarise(connections: Iterable[Connection]) -> dict[str, Any]:
    """Counts per verdict, bytes each way, and the hosts by verdict (for ledgers and summaries)."""
    items = list(connections)
    hosts: dict[str, list[str]] = {}
    for c in items:
        listed = hosts.setdefault(c.verdict, [])
        target = f"{c.host}:{c.port}"
        if target not in listed:
            listed.append(target)
    return {
        "attempts": len(items),
        **{verdict: sum(c.verdict == verdict for c in items) for verdict in (ALLOWED, DENIED, UNREACHABLE, INVALID)},
        "bytes_up": sum(c.bytes_up for c in items),
        "bytes_down": sum(c.bytes_down for c in items),
        "hosts": hosts,
    }


@dataclass(frozen=True, slots=True)
class NetworkLog:
    """What a sandbox tried to reach since the log was last read."""

    connections: tuple[Connection, ...] = ()
    dropped: int = 0
    """Attempts over the per-sandbox record cap, counted but not recorded."""
    model_calls: tuple[ModelCall, ...] = ()
    """The agent's calls to its model routes (see pool.egress.models.routes)."""

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: the records, the count dropped, and :func:`summarise`'s summary; the model
        calls and their summary when there were any."""
        fields: dict[str, Any] = {
            "connections": [c.as_dict() for c in self.connections],
            "dropped": self.dropped,
            "summary": summarise(self.connections),
        }
        if self.model_calls:
            fields["model_calls"] = [c.as_dict() for c in self.model_calls]
            fields["model_summary"] = summarise_model_calls(self.model_calls)
        return fields

    def __add__(self, other: NetworkLog) -> NetworkLog:
        return NetworkLog(
            self.connections + other.connections, self.dropped + other.dropped, self.model_calls + other.model_calls
        )
