"""How a caller reaches the pool's actors: through Ray (:mod:`~pool.cluster.calls.raycalls`, which
gives snapgym's errors back as themselves) or, on the actor's own node, the same-node shortcut
(:mod:`~pool.cluster.calls.fastpath`)."""
