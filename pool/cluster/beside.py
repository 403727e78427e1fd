"""Run a function where a sandbox lives, so several sandbox calls cost one round trip.

A pooled sandbox (a :class:`~pool.cluster.lease.Lease`) lives in a host actor's
process; each of its calls is a round trip. :func:`run_beside` sends the
function instead, by reference (a module-level function, as pickle names it),
and the host calls it with the sandbox itself. Any other sandbox is in this
process already, and the function is simply called.

The function runs with the same rights as any call of the lease (Ray's own
trust boundary: the same user); it must be importable on the host's node.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from pool.contract import RunsBeside, Sandbox

Result = TypeVar("Result")


def run_beside(sandbox: Sandbox, function: Callable[..., Result], *args: Any, **kwargs: Any) -> Result:
    """``function(sandbox, *args, **kwargs)``, run in the process that holds the sandbox.

    Whatever the function raises propagates.

    Raises:
        LeaseLostError: for a lease, when its host died.
    """
    if isinstance(sandbox, RunsBeside):
        result: Result = sandbox.run_beside(function, args, kwargs)
        return result
    return function(sandbox, *args, **kwargs)
