"""The connections the download cache speaks HTTP over.

On the client's side a :mod:`~pool.egress.cache.transport.streams` stream (plain, or TLS the proxy
runs itself over memory buffers) and :mod:`~pool.egress.cache.transport.http` (h11's state machine
over it); on the origin's side :mod:`~pool.egress.cache.transport.origin` (the forwarding
connection, reopened through the route's checks) and :mod:`~pool.egress.cache.transport.tls` (the
context that verifies origins).
"""
