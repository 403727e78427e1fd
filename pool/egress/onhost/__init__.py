"""The egress proxy attached to sandboxes that run on this machine (the local and Docker backends).

- :mod:`~pool.egress.onhost.service`: one backend instance's proxy, started on first use.
- :mod:`~pool.egress.onhost.gatekeeper`: one sandbox's gate, kept listening in its current network
  namespace and moved when the namespace changes.
- :mod:`~pool.egress.onhost.netns`: sockets that live in a sandbox's network namespace but belong to
  the host.
- :mod:`~pool.egress.onhost.setnetwork`: ``sandbox.set_network`` on top of them.
"""
