"""The audit of a sandbox's network: one record per connection attempt, allowed or not."""

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

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: the records, the count dropped, and :func:`summarise`'s summary."""
        return {
            "connections": [c.as_dict() for c in self.connections],
            "dropped": self.dropped,
            "summary": summarise(self.connections),
        }

    def __add__(self, other: NetworkLog) -> NetworkLog:
        return NetworkLog(self.connections + other.connections, self.dropped + other.dropped)
