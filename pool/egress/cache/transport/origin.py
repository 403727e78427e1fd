"""The origin side of a recording: the connection a request is forwarded on, opened again as needed.

The first connection is the one the proxy opened to judge the CONNECT (or plain request);
when the origin closes it, the next request opens another through the same route checks
(policy, addresses), so nothing reaches a host the connection's policy would refuse. HTTPS
origins are verified against the system's trust store plus ``egress.extra_ca_files`` (never
the store's own CA): a recording is only as good as the origin it came from.
"""

from __future__ import annotations

import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import h11

from pool.egress.cache.transport.http import Peer, encoded
from pool.egress.cache.transport.streams import PlainStream, TLSStream
from pool.egress.connection.relay import close
from pool.egress.connection.route import Refused, Route, Unreachable


class OriginFailed(Exception):
    """The origin could not be reached or did not answer in HTTP/1.1; the message says why."""


@dataclass(frozen=True, slots=True)
class OriginSpec:
    """Where a connection's requests go."""

    host: str
    """The host the client asked for (TLS server name and certificate check)."""
    tls: ssl.SSLContext | None
    """The client context for HTTPS origins; None for plain HTTP."""
    timeout_s: float
    max_head_bytes: int
    proxy_authorization: str | None = None
    """For plain HTTP through the upstream proxy: its credentials."""


class Origin:
    """The connection to the origin of one intercepted client connection."""

    def __init__(
        self, spec: OriginSpec, first: Route, dial: Callable[[], Awaitable[Route]], count: Callable[[int], None]
    ) -> None:
        self._spec = spec
        self._route: Route | None = first
        self._dial = dial
        self._count = count
        self._peer: Peer | None = None

    async def peer(self) -> Peer:
        """The HTTP peer to send the next request to (connecting, and for HTTPS handshaking, if needed).

        Raises:
            OriginFailed: no connection could be made.
        """
        if self._peer is not None:
            return self._peer
        if self._route is None:
            try:
                self._route = await self._dial()
            except Refused as exc:
                raise OriginFailed(f"refused on reconnecting ({exc.rule})") from None
            except Unreachable as exc:
                raise OriginFailed(f"unreachable on reconnecting ({exc.error})") from None
        route, spec = self._route, self._spec
        if spec.tls is None:
            stream = PlainStream(route.reader, route.writer, self._count, spec.timeout_s)
            self._peer = Peer(h11.CLIENT, stream, spec.max_head_bytes)
            return self._peer
        tls = TLSStream(route.reader, route.writer, spec.tls, self._count, spec.timeout_s,
                        server_side=False, server_hostname=spec.host)  # fmt: skip
        try:
            await tls.handshake()
        except ssl.SSLError as exc:
            self.close()
            raise OriginFailed(f"TLS with the origin failed: {exc.reason or exc}") from None
        except (OSError, TimeoutError) as exc:
            self.close()
            raise OriginFailed(f"TLS with the origin failed: {type(exc).__name__}") from None
        self._peer = Peer(h11.CLIENT, tls, spec.max_head_bytes)
        return self._peer

    def request(self, method: str, path: str, headers: list[tuple[str, str]]) -> h11.Request:
        """The request to send for ``path``: in origin form, or for plain HTTP via the upstream
        proxy in absolute form (to the checked address) with the upstream's credentials."""
        via = self._route.upstream_target if self._route is not None else None
        if via is None:
            return h11.Request(method=method, target=path, headers=encoded(headers))
        secret = self._spec.proxy_authorization
        credentials = [("Proxy-Authorization", secret)] if secret else []
        return h11.Request(method=method, target=f"http://{via}{path}", headers=encoded([*headers, *credentials]))

    def finished(self) -> None:
        """The exchange is over: keep the connection for the next request when both sides may."""
        if self._peer is not None and not self._peer.reusable():
            self.close()

    def close(self) -> None:
        """Drop the connection (the next request opens another)."""
        if self._route is not None:
            close(self._route.writer)
        self._route, self._peer = None, None
