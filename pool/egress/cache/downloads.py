"""The download cache of one egress proxy: its mode, its store, its CA, and how it reaches origins."""

from __future__ import annotations

import ssl

from pool.egress.cache.authority import StoreAuthority
from pool.egress.cache.settings import CacheMode, CacheSettings
from pool.egress.cache.store import CacheStore
from pool.egress.cache.transport.tls import client_context


class DownloadCache:
    """What the proxy's sessions share while caching is on (made by the proxy, once).

    Args:
        settings: the ``egress.cache`` settings; their mode must not be off.
        extra_ca_files: CAs trusted for origins besides the system's (``egress.extra_ca_files``).
    """

    def __init__(self, settings: CacheSettings, extra_ca_files: tuple[str, ...] = ()) -> None:
        if not settings.is_on or settings.dir is None:
            raise ValueError("a download cache needs mode record or replay, and a dir")
        self.settings = settings
        self.store = CacheStore(settings.dir)
        self.authority = StoreAuthority(settings.dir)
        self.origin_tls: ssl.SSLContext | None = (
            client_context(extra_ca_files) if settings.mode is CacheMode.RECORD else None
        )

    @property
    def is_replay(self) -> bool:
        """Whether requests are answered from the store only."""
        return self.settings.mode is CacheMode.REPLAY

    @property
    def ca_file(self) -> str:
        """The store CA's certificate, which sandboxes must trust while caching is on."""
        return str(self.authority.cert_path)
