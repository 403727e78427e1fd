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


def describe(exc: BaseException) -> str:
    """One line for an error from an actor call, without Ray's remote traceback."""
    from pool.errors import SnapgymError

    cause = cause_of(exc)
    if cause is not exc and not isinstance(cause, SnapgymError):
        return f"{type(cause).__name__} in a pool host"
    message = str(cause).splitlines()[0] if str(cause) else ""
    return f"{type(cause).__name__}: {message}"


def is_host_failure(exc: BaseException) -> bool:
    """Whether an actor call failed because the host itself is dead or broken."""
    from ray.exceptions import RayActorError

    from pool.errors import HostBrokenError

    # ConnectionError: the host's fast-path socket closed (its process died).
    return isinstance(exc, RayActorError | ConnectionError) or isinstance(cause_of(exc), HostBrokenError)
