"""Network for sandboxes: policies per phase, a host-side proxy that enforces them, and an audit.

A sandbox has no network device but loopback. Its only way out is snapgym's
egress proxy, which listens inside the sandbox's network namespace at
``127.0.0.1:3128`` while running on the host (:mod:`pool.egress.onhost.netns`), so
nothing of it is in the sandbox for the agent to change. Commands get
``HTTP_PROXY``/``HTTPS_PROXY`` pointing there; anything else (raw TCP, UDP,
DNS, ICMP) has no route.

Modules:

- :mod:`~pool.network.policy`: ``NetworkPolicy`` (Harbor's modes and host syntax), ``Phase``.
- :mod:`~pool.egress.settings`: ``EgressSettings``, the machine's side (hosts map, upstream proxy,
  extra CAs, trusted networks, the download cache).
- :mod:`~pool.egress.addresses`: what is refused whatever the policy (non-global addresses, Ray's ports).
- :mod:`~pool.egress.proxy`: the proxy (asyncio, one event loop thread per process): ``EgressProxy``
  and its per-sandbox ``Gate`` (:mod:`~pool.egress.gate`); each client connection is served by
  :mod:`~pool.egress.connection` (request head, body, destination, tunnel checks, relay, and the
  cached variant while the download cache is on) within :mod:`~pool.egress.limits`.
- :mod:`~pool.egress.cache`: verify-time downloads that replay offline (record/replay behind the proxy).
- :mod:`~pool.network.audit`: the records (``Connection``, ``NetworkLog``).
- :mod:`~pool.egress.onhost`: how the local and Docker backends attach the proxy to their sandboxes.
"""

from pool.egress.settings import EgressSettings
from pool.network.audit import Connection, NetworkLog, summarise
from pool.network.policy import NetworkMode, NetworkPolicy, Phase, PhasePolicies

__all__ = [
    "Connection",
    "EgressSettings",
    "NetworkLog",
    "NetworkMode",
    "NetworkPolicy",
    "Phase",
    "PhasePolicies",
    "summarise",
]
