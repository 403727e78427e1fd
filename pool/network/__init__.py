"""What a sandbox may reach and what it did reach: network policies and audit records.

Values every layer speaks (templates, backends, the pool, environments, the runner); the
host-side proxy that enforces them lives in :mod:`pool.egress`.
"""
