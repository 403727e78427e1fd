"""What a cached response is filed under: the parts of a request that decide what comes back.

The key is the SHA-256 of a canonical JSON object of:

- the method, scheme, host (normalised, as the proxy judged it) and port;
- the request target's path and query, exactly as sent (``/simple/x/?a=1``);
- for methods other than GET and HEAD, the SHA-256 of the request body (git's smart-HTTP
  ``POST /git-upload-pack`` asks for different packs with different bodies);
- the values of :data:`KEY_HEADERS`, headers that change which representation or part of it
  comes back. ``Range`` and ``If-Range`` (a part), ``Accept`` (PyPI's JSON or HTML simple
  pages), ``Accept-Encoding`` (a gzip body given to a client that cannot read it would be
  corrupt), ``If-None-Match``/``If-Modified-Since`` (a 304 given to a client without the
  validator would be empty) and ``Git-Protocol`` (git's v2 protocol answers differently).

Left out on purpose: ``User-Agent`` (tool versions would make every replay miss), and
everything else a client sends. Same tool, same request: same key.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from typing import Any

KEY_HEADERS = (
    "accept", "accept-encoding", "range", "if-range", "if-none-match", "if-modified-since", "git-protocol",
)  # fmt: skip
"""Request headers (lower case) whose values are part of the key."""
BODILESS_METHODS = frozenset({"GET", "HEAD"})
"""Methods whose body is not part of the key (they carry none that matters)."""
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()


@dataclass(frozen=True, slots=True)
class RequestKey:
    """One request as the cache sees it."""

    method: str
    scheme: str
    """``https`` for a request inside an intercepted TLS tunnel, else ``http``."""
    host: str
    port: int
    target: str
    """Path and query (origin form)."""
    body_sha256: str | None
    """The body's SHA-256 for methods other than GET and HEAD, else None."""
    headers: tuple[tuple[str, str], ...]
    """The :data:`KEY_HEADERS` the request had, lower-case names, values joined by ``", "``."""

    @property
    def url(self) -> str:
        """``scheme://host[:port]/path?query`` (the port only when it is not the scheme's)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        default = 443 if self.scheme == "https" else 80
        return f"{self.scheme}://{host}{'' if self.port == default else f':{self.port}'}{self.target}"

    @property
    def digest(self) -> str:
        """The key's hex SHA-256 (the index file's name)."""
        canonical = json.dumps(self.as_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready fields."""
        return {**asdict(self), "headers": [list(pair) for pair in self.headers]}


def key_headers(headers: list[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    """The :data:`KEY_HEADERS` among ``headers`` (any case), each once, in that order."""
    found: dict[str, list[str]] = {}
    for name, value in headers:
        if (lower := name.lower()) in KEY_HEADERS:
            found.setdefault(lower, []).append(value.strip())
    return tuple((name, ", ".join(found[name])) for name in KEY_HEADERS if name in found)


def origin_target(target: str) -> str:
    """The path and query of a request target: an absolute URL loses its scheme and authority."""
    if "://" in target:
        rest = target.split("://", 1)[1]
        cut = min((i for i in (rest.find("/"), rest.find("?")) if i >= 0), default=len(rest))
        target = rest[cut:]
    return target if target.startswith("/") else "/" + target if target != "*" else target
