"""The E2B SDK's exceptions translated into snapgym's error tree, at the boundary.

Every call into the SDK goes through :func:`provider_errors`, so nothing above
this module sees an ``e2b`` exception: a caller can tell a configuration fault
(bad key: fix it) from a crashed sandbox (replace it) from an outage (retry).
"""

from __future__ import annotations

import contextlib
import errno
from collections.abc import Iterator

import e2b

from pool.errors import (
    BackendError,
    ConfigError,
    FileOperationError,
    ProviderBusyError,
    SandboxCrashedError,
    SnapshotNotFoundError,
)


@contextlib.contextmanager
def provider_errors(what: str, *, file_operation: bool = False) -> Iterator[None]:
    """Translate the SDK's exceptions raised while doing ``what`` (for the message); for a
    ``file_operation``, a refused argument (a folder where a file should be) is a FileOperationError."""
    try:
        yield
    except e2b.InvalidArgumentException as exc:
        if file_operation:
            raise FileOperationError(errno.EISDIR, f"{what}: {exc}") from None
        raise ConfigError(f"E2B refused the request while {what}: {exc}") from None
    except e2b.AuthenticationException as exc:
        raise ConfigError(
            f"E2B refused the API key while {what} ({exc}); check E2B_API_KEY (or the backend's api_key option)"
        ) from None
    except e2b.RateLimitException as exc:
        raise ProviderBusyError(f"E2B rate-limited {what} after retrying ({exc}); lower the creation rate") from None
    except e2b.ServiceBusyException as exc:
        raise ProviderBusyError(f"E2B is busy ({exc}) while {what}; try again later") from None
    except e2b.FileNotFoundException as exc:
        raise FileOperationError(errno.ENOENT, f"{what}: no such file ({exc})") from None
    except e2b.SandboxNotFoundException as exc:
        raise SandboxCrashedError(
            f"the E2B sandbox is gone while {what} ({exc}): it was killed or outlived its lifetime"
        ) from None
    except e2b.NotFoundException as exc:
        raise SnapshotNotFoundError(f"E2B has no such template or snapshot while {what} ({exc})") from None
    except (e2b.SandboxNotRunningException, e2b.SandboxUnreachableException, e2b.GuestUnresponsiveException) as exc:
        raise SandboxCrashedError(f"the E2B sandbox stopped answering while {what} ({exc})") from None
    except e2b.NotEnoughSpaceException as exc:
        raise FileOperationError(errno.ENOSPC, f"{what}: the sandbox's disk is full ({exc})") from None
    except e2b.SandboxException as exc:
        raise BackendError(f"E2B failed while {what}: {type(exc).__name__}: {exc}") from None
