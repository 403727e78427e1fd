"""The Modal SDK's exceptions translated into snapgym's error tree, at the boundary."""

from __future__ import annotations

import contextlib
import errno
from collections.abc import Iterator

import modal.exception as mx

from pool.errors import (
    BackendError,
    ConfigError,
    FileOperationError,
    ProviderBusyError,
    SandboxCrashedError,
    UnsupportedError,
)


@contextlib.contextmanager
def provider_errors(what: str, *, file_operation: bool = False) -> Iterator[None]:
    """Translate the SDK's exceptions raised while doing ``what``."""
    try:
        yield
    except mx.AuthError as exc:
        raise ConfigError(
            f"Modal refused the token while {what} ({exc}); check MODAL_TOKEN_ID and MODAL_TOKEN_SECRET "
            "(or the backend's token_id/token_secret options)"
        ) from None
    except (mx.ResourceExhaustedError, mx.ServiceError, mx.ConnectionError) as exc:
        raise ProviderBusyError(f"Modal refused for now while {what}: {exc}") from None
    except mx.SandboxFilesystemNotFoundError as exc:
        raise FileOperationError(errno.ENOENT, f"{what}: no such file ({exc})") from None
    except mx.SandboxFilesystemIsADirectoryError as exc:
        raise FileOperationError(errno.EISDIR, f"{what}: a directory ({exc})") from None
    except mx.SandboxFilesystemError as exc:
        raise FileOperationError(errno.EIO, f"{what}: {exc}") from None
    except (mx.NotFoundError, mx.SandboxTerminatedError, mx.SandboxTimeoutError) as exc:
        if file_operation:
            raise FileOperationError(errno.ENOENT, f"{what}: {exc}") from None
        raise SandboxCrashedError(f"the Modal sandbox is gone while {what} ({exc})") from None
    except mx.UnimplementedError as exc:
        raise UnsupportedError(f"this Modal server does not offer what {what} needs ({exc})") from None
    except mx.InvalidError as exc:
        raise ConfigError(f"Modal refused the request while {what}: {exc}") from None
    except mx.Error as exc:
        raise BackendError(f"Modal failed while {what}: {type(exc).__name__}: {exc}") from None
