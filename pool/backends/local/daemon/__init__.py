"""The sandbox daemon: its C source, its build, and the host's side of talking to it.

- ``sandboxd/``: the daemon in C, one process per backend (``daemon.c`` and its plumbing at the
  top; ``keeper/`` a keeper per sandbox with its reuse proofs, ``instance/`` the init inside an
  instance, ``verifier/`` the strict and shared verifiers' mounts).
- :mod:`~pool.backends.local.daemon.build`: compiles it on first use, cached by the source's hash.
- :mod:`~pool.backends.local.daemon.client`: starts it, frames requests, matches replies.
"""
