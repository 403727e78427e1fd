"""The Modal SDK's exceptions translated into snapgym's error tree, at the boundary
(the rules: :mod:`pool.backends.remote.errors`)."""

from __future__ import annotations

import contextlib
import errno
from collections.abc import Iterator

import modal.exception as mx

from pool import errors as sg
from pool.backends.remote.errors import Rule, translated

RULES = (
    Rule(mx.AuthError, sg.ConfigError, "Modal refused the token while {what} ({exc}); check MODAL_TOKEN_ID and "
         "MODAL_TOKEN_SECRET (or the backend's token_id/token_secret options)"),
    Rule((mx.ResourceExhaustedError, mx.ServiceError, mx.ConnectionError), sg.ProviderBusyError,
         "Modal refused for now while {what}: {exc}"),
    Rule(mx.SandboxFilesystemNotFoundError, sg.FileOperationError, "{what}: no such file ({exc})",
         errno=errno.ENOENT),
    Rule(mx.SandboxFilesystemIsADirectoryError, sg.FileOperationError, "{what}: a directory ({exc})",
         errno=errno.EISDIR),
    Rule(mx.SandboxFilesystemError, sg.FileOperationError, "{what}: {exc}", errno=errno.EIO),
    Rule((mx.NotFoundError, mx.SandboxTerminatedError, mx.SandboxTimeoutError), sg.SandboxCrashedError,
         "the Modal sandbox is gone while {what} ({exc})", file_errno=errno.ENOENT),
    Rule(mx.UnimplementedError, sg.UnsupportedError, "this Modal server does not offer what {what} needs ({exc})"),
    Rule(mx.InvalidError, sg.ConfigError, "Modal refused the request while {what}: {exc}"),
    Rule(mx.Error, sg.BackendError, "Modal failed while {what}: {kind}: {exc}"),
)  # fmt: skip
"""In the order they are tried: the more specific exceptions first."""


@contextlib.contextmanager
def provider_errors(what: str, *, file_operation: bool = False) -> Iterator[None]:
    """Translate the SDK's exceptions raised while doing ``what``."""
    with translated(RULES, what, file_operation=file_operation):
        yield
