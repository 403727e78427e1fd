"""HTTP/1.x request heads as the egress proxy reads and writes them.

The parser is strict on purpose: whatever it accepts is forwarded to a server
that may read it differently, so anything two parsers could disagree on (bare
CR or LF, folded or space-padded header names, control bytes, user info in a
URL, a port out of range) is refused rather than repaired.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pool.network.policy import normalise_host, parse_address

_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_VERSION = re.compile(r"HTTP/1\.[01]")
_TARGET = re.compile(r"[\x21-\x7e]+")
_VALUE = re.compile(r"[\t\x20-\x7e\x80-\xff]*")
_NUMERIC = re.compile(r"[0-9]+|0[xX][0-9a-fA-F]*")
_LABEL = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?")


@dataclass(frozen=True, slots=True)
class Authority:
    """A host and port from a request (``host:port``, ``[v6]:port``)."""

    host: str
    """The host, normalised (lower case, no brackets, no trailing dot)."""
    port: int

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


@dataclass(frozen=True, slots=True)
class RequestHead:
    """A request line and its headers, as received."""

    method: str
    target: str
    version: str
    headers: tuple[tuple[str, str], ...]

    def values(self, name: str) -> list[str]:
        """Every value of header ``name`` (case-insensitive), in order."""
        wanted = name.lower()
        return [value for key, value in self.headers if key.lower() == wanted]

    def render(self, target: str, headers: list[tuple[str, str]]) -> bytes:
        """This request with another target and headers, as bytes to send."""
        lines = [f"{self.method} {target} {self.version}", *(f"{k}: {v}" for k, v in headers), "", ""]
        return "\r\n".join(lines).encode("latin-1")


def parse_head(data: bytes) -> RequestHead:
    """Parse a request head that ends in an empty line.

    Raises:
        ValueError: it is not a well-formed HTTP/1.0 or 1.1 request head; the message says why.
    """
    if not data.endswith(b"\r\n\r\n"):
        raise ValueError("the request head does not end in an empty line")
    text = data[:-4].decode("latin-1")
    if "\n" in text.replace("\r\n", "") or "\r" in text.replace("\r\n", ""):
        raise ValueError("bare CR or LF in the request head")
    line, *fields = text.split("\r\n")
    parts = line.split(" ")
    if len(parts) != 3:
        raise ValueError("the request line is not 'METHOD TARGET VERSION'")
    method, target, version = parts
    if not _TOKEN.fullmatch(method) or not _TARGET.fullmatch(target) or not _VERSION.fullmatch(version):
        raise ValueError("the request line is not 'METHOD TARGET HTTP/1.x'")
    return RequestHead(method, target, version, tuple(_header(f) for f in fields))


def is_request_line(line: bytes) -> bool:
    """Whether ``line`` (without its line end) is an HTTP/1.x request line."""
    parts = line.decode("latin-1").split(" ")
    return (
        len(parts) == 3
        and _TOKEN.fullmatch(parts[0]) is not None
        and _TARGET.fullmatch(parts[1]) is not None
        and re.fullmatch(r"HTTP/\d\.\d", parts[2]) is not None
    )


def parse_authority(text: str, *, default_port: int | None = None) -> Authority:
    """``host[:port]`` with a host name, an IPv4 literal or a bracketed IPv6 literal.

    Raises:
        ValueError: the host or port is malformed, or the port is missing without a default.
    """
    if text.startswith("["):
        host, bracket, rest = text[1:].partition("]")
        if not bracket or ":" not in host or "%" in host or parse_address(host) is None:
            raise ValueError(f"bad IPv6 literal in {text!r}")
    else:
        host, colon, port_text = text.partition(":")
        rest = colon + port_text
        if not _is_host(host):
            raise ValueError(f"bad host in {text!r}")
    if rest:
        port_text = rest[1:] if rest.startswith(":") else "x"
        if not port_text.isdigit() or not 0 < int(port_text) < 65536 or len(port_text) > 5:
            raise ValueError(f"bad port in {text!r}")
        return Authority(normalise_host(host), int(port_text))
    if default_port is None:
        raise ValueError(f"no port in {text!r}")
    return Authority(normalise_host(host), default_port)


def parse_proxy_url(target: str) -> tuple[Authority, str]:
    """The authority and the origin-form path (``/p?q``) of an absolute ``http://`` target.

    Raises:
        ValueError: the target is not an absolute ``http://`` URL with a plain host.
    """
    scheme, separator, rest = target.partition("://")
    if not separator or scheme.lower() != "http":
        raise ValueError("the target is not an absolute http:// URL")
    end = min((i for i in (rest.find("/"), rest.find("?")) if i >= 0), default=len(rest))
    authority_text, path = rest[:end], rest[end:]
    if "@" in authority_text or "#" in target or "\\" in target:
        raise ValueError("user info, fragments and backslashes are not allowed in a proxy URL")
    if not path.startswith("/"):
        path = "/" + path
    return parse_authority(authority_text, default_port=80), path


def host_of(value: str) -> str:
    """The host named by a ``Host`` header value (port dropped).

    Raises:
        ValueError: the value is not ``host[:port]``.
    """
    return parse_authority(value.strip(), default_port=0).host


def _header(field: str) -> tuple[str, str]:
    name, colon, value = field.partition(":")
    if not colon or not _TOKEN.fullmatch(name):
        raise ValueError("malformed header line (folded, or a name with spaces or odd characters)")
    value = value.strip(" \t")
    if not _VALUE.fullmatch(value):
        raise ValueError(f"control characters in header {name!r}")
    return name, value


def _is_host(host: str) -> bool:
    if parse_address(host) is not None:
        return ":" not in host and "%" not in host  # IPv6 only in brackets, never with a zone
    name = host[:-1] if host.endswith(".") else host
    labels = name.split(".")
    # A numeric last label is an address in disguise (127.1, 0x7f000001): inet_aton would take it.
    return (
        0 < len(name) <= 253 and all(_LABEL.fullmatch(label) for label in labels) and not _NUMERIC.fullmatch(labels[-1])
    )
