"""The Ray pool: host actors that own warm sandboxes, the manager that hands out leases, and the
pool's config and metrics. Ray is imported only here (and lazily)."""
