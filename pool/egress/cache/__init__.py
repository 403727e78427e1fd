"""Verify-time downloads that replay offline: a content-addressed response cache behind the egress proxy.

The backend option ``egress.cache`` (:class:`CacheSettings`) sets a mode:

- ``off`` (the default): the proxy relays tunnels as bytes and sees no HTTP inside TLS.
- ``record``: for every connection the policy allowed, the proxy terminates the sandbox's TLS
  itself, reads its HTTP/1.1 requests (h11), forwards each to the real origin over TLS verified
  against the system's CAs plus ``egress.extra_ca_files``, stores the response, and returns it.
- ``replay``: the proxy connects nowhere and looks up no name; requests are answered from the
  store, byte for byte as recorded. A request with nothing stored is answered 504 and recorded
  as ``denied`` by the rule ``replay miss: URL``, so a strict verification that fails on it is
  ``network_denied`` (see :mod:`envs.episode.network`), never a silent 0.

The policy decides before anything is fetched or served, exactly as without the cache: a replay
of a host the policy refuses is refused (a replay judges names without DNS, addresses from
literals and ``egress.hosts``). Inside an intercepted tunnel every request must name the
tunnel's host, not only the first.

What is stored and how it is keyed: :mod:`~pool.egress.cache.key` (method, URL, a body digest
for methods other than GET/HEAD, a few representation headers), :mod:`~pool.egress.cache.store`
(``blobs/sha256/<hex>`` bodies, ``index/<key>.json`` entries, each written aside then renamed;
every blob is checked against its name before it is served), :mod:`~pool.egress.cache.serving.intercept`
(a connection's requests, each answered by :mod:`~pool.egress.cache.serving.replay` or
:mod:`~pool.egress.cache.serving.record`, with :mod:`~pool.egress.cache.serving.exchange`), and which responses
are never stored (:mod:`~pool.egress.cache.serving.record`: those to requests carrying ``Authorization``
or ``Cookie``; ``Set-Cookie`` is dropped from stored headers). Moving a store: ``python -m pool.egress.cache
export DIR OUT.tar`` and ``import IN.tar DIR`` (:mod:`~pool.egress.cache.archive`). Other modules:
:mod:`~pool.egress.cache.settings`, :mod:`~pool.egress.cache.authority` (the store's CA),
:mod:`~pool.egress.cache.downloads` (what the proxy shares), and the sub-package
:mod:`~pool.egress.cache.transport` (the connections: TLS over memory buffers, h11, the origin's side).

**The trade-off.** To read HTTPS, the proxy presents certificates signed by the store's own CA,
and while caching is on (and only then) sandboxes are told to trust that CA (it is added to the
bundle at ``/etc/snapgym/ca-certificates.crt`` that ``SSL_CERT_FILE`` and friends name). Its key
is on the host only (``DIR/ca/ca.key``, mode 0600), never in a sandbox. But whoever obtains that
key (or the exported tar, which holds it) can impersonate any site to the sandboxes of every run
that uses this cache, and whoever can write ``DIR`` decides what those sandboxes download (an
index entry is not signed; only a blob's content is checked, against the entry's digest).
Treat the cache folder like a credential. A client that does not trust the store's CA fails its
TLS handshake: nothing falls back to an unrecorded tunnel.

Limits: HTTP/1.1 only (ALPN offers nothing else; HTTP/2 and WebSocket upgrades are refused
inside an intercepted tunnel); a tunnel carrying neither TLS nor HTTP is relayed unrecorded in
``record`` and refused in ``replay``, and while caching is on a protocol whose server speaks
first gets nothing until the client speaks; certificate pinning defeats interception; Cache-
Control is not consulted (a recording, not an HTTP cache); the newest recording of a key wins.
"""

from pool.egress.cache.settings import CacheMode, CacheSettings

__all__ = ["CacheMode", "CacheSettings"]
