"""One client connection as the steps that serve it see it: its streams, its record, its policy."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from pool.egress.connection.attempt import Attempt
from pool.egress.connection.head import Authority
from pool.egress.connection.relay import reply
from pool.egress.connection.route import Network, Route, open_route
from pool.network.policy import NetworkPolicy


@dataclass(frozen=True, slots=True)
class Client:
    """A client connection being served: what each step of serving it reads, writes or follows.

    Frozen: a connection keeps its streams, its record and its policy from its first byte to its
    last (the record itself is filled in as the steps go).
    """

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    attempt: Attempt
    """Its audit record, being filled in."""
    policy: NetworkPolicy
    """The policy of the moment it arrived."""
    network: Network
    """What the connections of its gate share."""

    async def reply(self, status: int, body: str) -> None:
        """Answer ``status`` with a one-line text body, giving up after the reply timeout."""
        await reply(self.writer, status, body, self.network.limits.reply_timeout_s)

    async def dial(self, target: Authority, *, tunnel: bool) -> Route:
        """Connect to ``target`` under this connection's policy, as
        :func:`~pool.egress.connection.route.open_route` does (raising what it raises)."""
        return await open_route(target, self.policy, self.network, self.attempt, tunnel=tunnel)
