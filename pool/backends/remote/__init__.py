"""Cloud backends' common part: a provider's sandboxes pooled with the local backend's guarantees.

:mod:`pool.backends.remote.provider` is what a provider must offer (one small adapter per SDK, under
``pool/backends/<name>/``); :mod:`pool.backends.remote.options` the options every cloud backend takes;
:mod:`pool.backends.remote.backend` builds, labels, catalogues and reaps; :mod:`pool.backends.remote.link` is
what a sandbox holds of its backend (provider, pace, threads, options: creates, start digests, snapshots);
:mod:`pool.backends.remote.sandbox` hands over to warm spares; :mod:`pool.backends.remote.verify` verifies
strictly; :mod:`pool.backends.remote.errors` translates an SDK's exceptions by a table.
"""
