"""The TLS client context the cache uses to reach origins (a module of its own: the download cache
needs it without the connection machinery of :mod:`pool.egress.cache.transport.origin`)."""

from __future__ import annotations

import ssl


def client_context(extra_ca_files: tuple[str, ...]) -> ssl.SSLContext:
    """TLS client context for origins: the system's CAs plus ``extra_ca_files``, HTTP/1.1 only."""
    context = ssl.create_default_context()
    for path in extra_ca_files:
        context.load_verify_locations(cafile=path)
    context.set_alpn_protocols(["http/1.1"])
    return context
