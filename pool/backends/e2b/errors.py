"""The E2B SDK's exceptions translated into snapgym's error tree, at the boundary.

Every call into the SDK goes through :func:`provider_errors`, so nothing above
this module sees an ``e2b`` exception (the rules: :mod:`pool.backends.remote.errors`).
"""

from __future__ import annotations

import contextlib
import errno
from collections.abc import Iterator

import e2b

from pool import errors as sg
from pool.backends.remote.errors import Rule, translated

RULES = (
    Rule(e2b.InvalidArgumentException, sg.ConfigError, "E2B refused the request while {what}: {exc}",
         file_errno=errno.EISDIR),  # a folder where a file should be
    Rule(e2b.AuthenticationException, sg.ConfigError,
         "E2B refused the API key while {what} ({exc}); check E2B_API_KEY (or the backend's api_key option)"),
    Rule(e2b.RateLimitException, sg.ProviderBusyError,
         "E2B rate-limited {what} after retrying ({exc}); lower the creation rate"),
    Rule(e2b.ServiceBusyException, sg.ProviderBusyError, "E2B is busy ({exc}) while {what}; try again later"),
    Rule(e2b.FileNotFoundException, sg.FileOperationError, "{what}: no such file ({exc})", errno=errno.ENOENT),
    Rule(e2b.SandboxNotFoundException, sg.SandboxCrashedError,
         "the E2B sandbox is gone while {what} ({exc}): it was killed or outlived its lifetime"),
    Rule(e2b.NotFoundException, sg.SnapshotNotFoundError, "E2B has no such template or snapshot while {what} ({exc})"),
    Rule((e2b.SandboxNotRunningException, e2b.SandboxUnreachableException, e2b.GuestUnresponsiveException),
         sg.SandboxCrashedError, "the E2B sandbox stopped answering while {what} ({exc})"),
    Rule(e2b.NotEnoughSpaceException, sg.FileOperationError, "{what}: the sandbox's disk is full ({exc})",
         errno=errno.ENOSPC),
    Rule(e2b.SandboxException, sg.BackendError, "E2B failed while {what}: {kind}: {exc}"),
)  # fmt: skip
"""In the order they are tried: the more specific exceptions first."""


@contextlib.contextmanager
def provider_errors(what: str, *, file_operation: bool = False) -> Iterator[None]:
    """Translate the SDK's exceptions raised while doing ``what`` (for the message); for a
    ``file_operation``, a refused argument (a folder where a file should be) is a FileOperationError."""
    with translated(RULES, what, file_operation=file_operation):
        yield
