"""One client connection of the egress proxy, from its first byte to its last.

:mod:`~pool.egress.connection.session` serves it: the request head
(:mod:`~pool.egress.connection.head`), a plain request's body
(:mod:`~pool.egress.connection.body`), the destination, judged and dialled
(:mod:`~pool.egress.connection.route`), a tunnel's first bytes checked against
its host (:mod:`~pool.egress.connection.opening`, :mod:`~pool.egress.connection.sni`),
and the byte relay (:mod:`~pool.egress.connection.relay`), recording all of it
in its audit record (:mod:`~pool.egress.connection.attempt`). While the download
cache is on, a judged connection is served by :mod:`~pool.egress.connection.cached`
instead; the steps both share are :mod:`~pool.egress.connection.steps`. Each step is given the
connection it serves as a :class:`~pool.egress.connection.client.Client`.
"""
