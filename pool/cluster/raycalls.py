"""Calling the pool's actors: snapgym errors raised inside an actor come back as themselves."""

from __future__ import annotations

from typing import Any


def get(ref: Any, *, timeout_s: float | None = None) -> Any:
    """``ray.get``, re-raising a SnapgymError from the actor as that error (not a RayTaskError)."""
    import ray
    from ray.exceptions import RayTaskError

    from pool.errors import SnapgymError

    try:
        return ray.get(ref, timeout=timeout_s)
    except RayTaskError as exc:
        cause = cause_of(exc)
        if isinstance(cause, SnapgymError):
            raise cause from None
        raise


def cause_of(exc: BaseException) -> BaseException:
    """The exception an actor method raised, for a RayTaskError; any other exception as is."""
    from ray.exceptions import RayTaskError

    if isinstance(exc, RayTaskError):
        unwrap: Any = exc.as_instanceof_cause
        cause: BaseException = unwrap()
        return cause
    return exc


def actor_class(cls: type, **options: Any) -> Any:
    """``ray.remote(**options)(cls)``, typed loosely (Ray's stubs do not cover actor options)."""
    import ray

    remote: Any = ray.remote
    return remote(**options)(cls)
