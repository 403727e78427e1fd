"""What one local sandbox does to its instance in the daemon, through its link.

``link`` (requests, the init's health, file operations), ``console`` (one sandbox's commands:
their fields and its shell slot), ``commands`` (exec and the persistent shell's steps),
``shellsession`` (the shell itself), ``capture`` (a command's output read from its pipes, capped),
``checkpoint`` (the writable layer frozen into a snapshot), ``graftlayer`` (a toolchain verifier's
installs), ``viewscan`` (a strict verifier's view). ``pool.backends.local.sandbox`` composes them.
"""
