"""Cloud backends' common part: a provider's sandboxes pooled with the local backend's guarantees.

:mod:`pool.remote.provider` is what a provider must offer (one small adapter per SDK, under
``pool/backends/<name>/``); :mod:`pool.remote.backend` builds, digests, paces, labels and reaps;
:mod:`pool.remote.sandbox` hands over to warm spares; :mod:`pool.remote.verify` verifies strictly.
"""
