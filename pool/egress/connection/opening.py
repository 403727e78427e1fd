"""The first bytes a client sends through a CONNECT tunnel, checked against the CONNECT host.

A tunnel to an allowed host must not carry a conversation meant for another
host at the same address (a CDN or a shared server picks the site by TLS SNI
or by the HTTP ``Host`` header). So before any client byte reaches the
destination, the proxy reads enough of the opening to tell TLS, HTTP or
anything else, and refuses a ClientHello naming another server or an HTTP
request for another host. Other protocols (SSH, a database) pass as they are;
the destination's own first bytes (an SMTP or SSH banner) flow meanwhile.
"""

from __future__ import annotations

import asyncio
import enum
import re

from pool.egress.connection.head import Authority, host_of, is_request_line, parse_authority, parse_head
from pool.egress.connection.relay import CHUNK_BYTES
from pool.egress.connection.sni import Truncated, client_hello, is_tls_handshake, server_name
from pool.egress.limits import ProxyLimits
from pool.network.policy import normalise_host

_TOKEN_PREFIX = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]*")
METHODS = frozenset(
    b"GET HEAD POST PUT DELETE CONNECT OPTIONS TRACE PATCH QUERY PRI ACL BIND CHECKIN CHECKOUT COPY LABEL "
    b"LINK LOCK MERGE MKACTIVITY MKCALENDAR MKCOL MKREDIRECTREF MKWORKSPACE MOVE ORDERPATCH PROPFIND "
    b"PROPPATCH REBIND REPORT SEARCH UNBIND UNCHECKOUT UNLINK UNLOCK UPDATE UPDATEREDIRECTREF "
    b"VERSION-CONTROL BASELINE-CONTROL".split()
)
"""HTTP methods (the IANA registry): an opening that starts with one is an HTTP request."""
_MIN_GROWTH = 512
_PAUSE_S = 0.05


class Kind(enum.Enum):
    """What an opening is, as far as its bytes tell."""

    TLS = "tls"
    HTTP = "http"
    OTHER = "other"
    MORE = "more"
    """Not yet known: more bytes are needed."""


class Unreadable(Exception):
    """The client started an opening it did not finish (too long, too slow, or it ended)."""


async def read_opening(reader: asyncio.StreamReader, limits: ProxyLimits) -> bytes:
    """The client's first bytes in a tunnel: as many as it takes to tell what they are.

    Returns empty bytes when the client ends without sending any. The first read waits as
    long as the connection is not idle (the destination may be the one to speak first);
    the rest of the opening must follow within the head timeout.

    Raises:
        Unreadable: the opening is too long or too slow, or the client ended inside it.
    """
    data = bytearray(await reader.read(CHUNK_BYTES))
    try:
        async with asyncio.timeout(limits.head_timeout_s):
            while data and kind(bytes(data)) is Kind.MORE:
                if len(data) >= limits.max_head_bytes:
                    raise Unreadable("opening too long")
                await _grow(reader, data)
    except TimeoutError:
        raise Unreadable("opening too slow") from None
    return bytes(data)


async def _grow(reader: asyncio.StreamReader, data: bytearray) -> None:
    # Judging costs a pass over all bytes so far; judging again after each of many tiny reads
    # would let a client trickling bytes spend the proxy's (every gate's) time quadratically.
    # So judge again once the opening grew by a quarter, or once the client paused.
    checked = len(data)
    while len(data) - checked < max(_MIN_GROWTH, checked // 4):
        try:
            async with asyncio.timeout(_PAUSE_S):
                more = await reader.read(CHUNK_BYTES)
        except TimeoutError:
            if len(data) > checked:
                return
            continue
        if not more:
            raise Unreadable("the client ended inside its opening")
        data += more


def kind(data: bytes) -> Kind:
    """Whether ``data`` is a whole TLS ClientHello, a whole HTTP request head, something else,
    or the start of a ClientHello or request head.

    No size or time makes a possible start count as "something else": a client could then
    pad or pause its way past the check. (The caller cuts an opening that never resolves.)
    """
    if not data:
        return Kind.MORE
    if data[0] == 0x16 and (len(data) < 3 or is_tls_handshake(data)):
        return _tls(data)
    token = _TOKEN_PREFIX.match(data)
    assert token is not None  # the pattern matches the empty string
    if token.end() == len(data):  # a method, or just a word (a 4-byte "ping")?
        return Kind.MORE if any(method.startswith(data.upper()) for method in METHODS) else Kind.OTHER
    if token.end() == 0 or data[token.end()] != ord(" "):
        return Kind.OTHER
    if data[: token.end()].upper() not in METHODS:  # "EHLO x" (SMTP) or a request with an odd method?
        line_end = data.find(b"\n")
        if line_end < 0:
            return Kind.MORE
        if not is_request_line(data[:line_end].rstrip(b"\r")):
            return Kind.OTHER
    return Kind.HTTP if b"\r\n\r\n" in data else Kind.MORE


def refusal(data: bytes, target: Authority) -> tuple[str | None, str | None]:
    """Check an opening against the CONNECT host.

    Returns:
        The SNI name (None when the opening is not TLS or names no server) and the rule that
        refuses the opening (``"sni-mismatch: <name>"``, ``"host-mismatch: <host>"``), or None.
    """
    found = kind(data)
    if found is Kind.TLS:
        try:
            name = server_name(data)
        except ValueError as exc:
            return None, f"unreadable TLS ClientHello: {exc}"
        if name is not None and normalise_host(name) != target.host:
            return name, f"sni-mismatch: {name}"
        return name, None
    if found is Kind.HTTP:
        return None, _http_refusal(data[: data.index(b"\r\n\r\n") + 4], target)
    return None, None


def _tls(data: bytes) -> Kind:
    if len(data) < 3:
        return Kind.MORE
    try:
        client_hello(data)
    except Truncated:
        return Kind.MORE
    except ValueError:
        pass  # whole enough to refuse
    return Kind.TLS


def _http_refusal(head_bytes: bytes, target: Authority) -> str | None:
    try:
        head = parse_head(head_bytes)
    except ValueError as exc:
        return f"host-mismatch: unreadable request ({exc})"
    hosts = head.values("Host")
    if len(hosts) != 1:
        return f"host-mismatch: {'no' if not hosts else len(hosts)} Host headers"
    try:
        named = [host_of(hosts[0])]
        if "://" in head.target:  # an absolute URL wins over Host at the server (RFC 9112 3.2.2)
            named.append(parse_authority(head.target.split("://", 1)[1].split("/", 1)[0], default_port=0).host)
    except ValueError:
        return "host-mismatch: unreadable host"
    for host in named:
        if host != target.host:
            return f"host-mismatch: {host}"
    return None
