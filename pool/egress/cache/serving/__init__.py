"""Serving an intercepted connection's requests through the download cache.

:mod:`~pool.egress.cache.serving.intercept` reads a connection's requests and hands each to
:mod:`~pool.egress.cache.serving.replay` (from the store) or :mod:`~pool.egress.cache.serving.record`
(from the origin, stored on the way back); :mod:`~pool.egress.cache.serving.exchange` is what both
need (the connection's context, the audit mark, the request body, an error answer).
"""
