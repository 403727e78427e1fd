"""The Daytona SDK's exceptions translated into snapgym's error tree, at the boundary.

Daytona's SDK retries nothing (429 and 503 included), so a refusal for now is a
:class:`~pool.errors.ProviderBusyError`, which the remote layer retries with backoff.
The rules: :mod:`pool.backends.remote.errors`.
"""

from __future__ import annotations

import contextlib
import errno
from collections.abc import Iterator

import daytona

from pool import errors as sg
from pool.backends.remote.errors import Rule, translated


def _no_snapshot(exc: BaseException) -> bool:
    text = str(exc).lower()
    return "snapshot" in text and "not found" in text


RULES = (
    Rule((daytona.DaytonaAuthenticationError, daytona.DaytonaAuthorizationError, daytona.DaytonaForbiddenError),
         sg.ConfigError, "Daytona refused the credentials while {what} ({exc}); check DAYTONA_API_KEY (or the "
         "backend's api_key option) and the organisation it belongs to"),
    Rule((daytona.DaytonaRateLimitError, daytona.DaytonaServiceUnavailableError, daytona.DaytonaBadGatewayError,
          daytona.DaytonaConnectionError), sg.ProviderBusyError, "Daytona refused for now while {what}: {exc}"),
    Rule(daytona.DaytonaNotFoundError, sg.SandboxCrashedError, "the Daytona sandbox is gone while {what} ({exc})",
         file_errno=errno.ENOENT, file_message="{what}: no such file ({exc})"),
    Rule(daytona.DaytonaBadRequestError, sg.SnapshotNotFoundError,
         "Daytona has no such snapshot while {what} ({exc})", file_errno=errno.EINVAL, when=_no_snapshot),
    Rule(daytona.DaytonaBadRequestError, sg.ConfigError, "Daytona refused the request while {what}: {exc}",
         file_errno=errno.EINVAL),
    Rule(daytona.DaytonaError, sg.BackendError, "Daytona failed while {what}: {kind}: {exc}",
         file_errno=errno.EIO),
)  # fmt: skip
"""In the order they are tried: the more specific exceptions first."""


@contextlib.contextmanager
def provider_errors(what: str, *, file_operation: bool = False) -> Iterator[None]:
    """Translate the SDK's exceptions raised while doing ``what``; for a ``file_operation`` every
    refusal is a FileOperationError (ENOENT for a missing path)."""
    with translated(RULES, what, file_operation=file_operation):
        yield
