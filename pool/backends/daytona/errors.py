"""The Daytona SDK's exceptions translated into snapgym's error tree, at the boundary.

Daytona's SDK retries nothing (429 and 503 included), so a refusal for now is a
:class:`~pool.errors.ProviderBusyError`, which the remote layer retries with backoff.
"""

from __future__ import annotations

import contextlib
import errno
from collections.abc import Iterator

import daytona

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
    """Translate the SDK's exceptions raised while doing ``what``; for a ``file_operation`` every
    refusal is a FileOperationError (ENOENT for a missing path)."""
    try:
        yield
    except (
        daytona.DaytonaAuthenticationError,
        daytona.DaytonaAuthorizationError,
        daytona.DaytonaForbiddenError,
    ) as exc:
        raise ConfigError(
            f"Daytona refused the credentials while {what} ({exc}); check DAYTONA_API_KEY (or the backend's "
            "api_key option) and the organisation it belongs to"
        ) from None
    except (
        daytona.DaytonaRateLimitError,
        daytona.DaytonaServiceUnavailableError,
        daytona.DaytonaBadGatewayError,
        daytona.DaytonaConnectionError,
    ) as exc:
        raise ProviderBusyError(f"Daytona refused for now while {what}: {exc}") from None
    except daytona.DaytonaNotFoundError as exc:
        if file_operation:
            raise FileOperationError(errno.ENOENT, f"{what}: no such file ({exc})") from None
        raise SandboxCrashedError(f"the Daytona sandbox is gone while {what} ({exc})") from None
    except daytona.DaytonaBadRequestError as exc:
        if file_operation:
            raise FileOperationError(errno.EINVAL, f"{what}: {exc}") from None
        if "snapshot" in str(exc).lower() and "not found" in str(exc).lower():
            raise SnapshotNotFoundError(f"Daytona has no such snapshot while {what} ({exc})") from None
        raise ConfigError(f"Daytona refused the request while {what}: {exc}") from None
    except daytona.DaytonaError as exc:
        if file_operation:
            raise FileOperationError(errno.EIO, f"{what}: {exc}") from None
        raise BackendError(f"Daytona failed while {what}: {type(exc).__name__}: {exc}") from None
