"""Cloud backends' common part: a provider's sandboxes pooled with the local backend's guarantees.

:mod:`pool.backends.remote.provider` is what a provider must offer (one small adapter per SDK, under
``pool/backends/<name>/``); :mod:`pool.backends.remote.backend` builds, digests, paces, labels and reaps;
:mod:`pool.backends.remote.sandbox` hands over to warm spares; :mod:`pool.backends.remote.verify` verifies strictly.
"""
