"""What one gate of the egress proxy lets a (hostile) client use up."""

from __future__ import annotations

from dataclasses import dataclass, fields

from pool.validation import require_positive


@dataclass(frozen=True, slots=True)
class ProxyLimits:
    """Caps and timeouts that keep one sandbox from starving the proxy or the other gates."""

    max_head_bytes: int = 64 * 1024
    """The largest request head (and the most first bytes read to check a tunnel's opening)."""
    head_timeout_s: float = 30.0
    """How long a client has to send its whole request head (or a tunnel's opening, once begun)."""
    idle_timeout_s: float = 600.0
    """An open connection with no bytes either way for this long is cut."""
    reply_timeout_s: float = 5.0
    """How long the proxy spends writing a refusal (and waiting for the client to close)."""
    max_connections: int = 256
    """Open connections per gate; the next ones are answered 503."""
    max_records: int = 10_000
    """Audit records a gate keeps between drains; later ones are only counted."""
    max_lookups: int = 8
    """DNS lookups a gate may have in flight (they share the proxy's resolver threads)."""

    def __post_init__(self) -> None:
        require_positive(self, (item.name for item in fields(self)), what="egress proxy limit")
