"""Every error snapgym raises, as one tree under :class:`SnapgymError`.

Each message says what failed and what to do about it. Provider and OS errors
are translated at the backend boundary and never escape it.

::

    SnapgymError
    ├── ConfigError                      bad options or template (ValueError)
    │   ├── DockerfileError              a Dockerfile instruction cannot be realised
    │   │   └── HostPackagesMissingError a host-base task needs apt packages the host lacks
    │   └── ImageError                   an image cannot be had (not found, refused, unreachable, damaged)
    │       └── RegistryUnreachableError  the registry and its mirrors could not be reached (the network)
    ├── UnsupportedError                 the kernel or machine lacks a feature
    │   └── CompilerMissingError         no C compiler for the sandbox daemon
    ├── BuildError                       a template's setup step or healthcheck failed
    ├── SnapshotError                    a snapshot is missing, corrupt or foreign
    │   ├── SnapshotNotFoundError        (LookupError)
    │   ├── SnapshotCorruptError         a stored layer or record differs from its digest
    │   ├── SnapshotTooLargeError        a snapshot is over the backend's size limit
    │   └── StoreFullError               the snapshot store's filesystem is full
    ├── SandboxError                     a sandbox could not do what was asked
    │   ├── SandboxClosedError           used after close()
    │   ├── SandboxCrashedError          its init or the daemon died
    │   ├── SandboxOutOfMemoryError      its own processes used up its memory and its init died
    │   ├── SandboxEndedError            its own processes ended it (a cloud sandbox's entrypoint exited)
    │   ├── CommandRejectedError         the command itself is unusable (ValueError)
    │   └── FileOperationError           read_file/write_file failed (OSError)
    ├── BackendError                     the backend itself failed
    │   └── HostBrokenError              a pool host's backend died (its sandboxes with it)
    └── PoolError                        the sandbox pool cannot serve the request
        ├── PoolClosedError              used after close()
        ├── AcquireTimeoutError          no sandbox became ready in time (TimeoutError)
        ├── LeaseLostError               the lease was reclaimed or its host died
        └── CrashLoopError               sandboxes keep failing; the pool stopped recreating them
"""

from __future__ import annotations


class SnapgymError(Exception):
    """Base class of every snapgym error."""


class ConfigError(SnapgymError, ValueError):
    """An option, template field or argument is invalid."""


class DockerfileError(ConfigError):
    """A Dockerfile instruction cannot be turned into a build step; the message names the line."""


class HostPackagesMissingError(DockerfileError):
    """A task on the host base needs apt packages this host does not have."""

    def __init__(self, message: str, packages: list[str]) -> None:
        super().__init__(message)
        self.packages = packages
        """The missing packages."""


class ImageError(ConfigError):
    """An image cannot be had: not found, credentials refused, registry unreachable, or a blob
    that differs from its digest; the message names the image and how to provide it."""


class RegistryUnreachableError(ImageError):
    """The registry (and its mirrors) could not be reached or did not answer in time: the network is
    at fault, not the image, so an image resolved before may be used as it was then."""


class UnsupportedError(SnapgymError):
    """This machine or kernel lacks a feature the backend needs."""


class CompilerMissingError(UnsupportedError):
    """No C compiler is available to build the sandbox daemon."""


class BuildError(SnapgymError):
    """Building a template into a snapshot failed."""


class SnapshotError(SnapgymError):
    """A snapshot is missing, corrupt, or belongs to another backend."""


class SnapshotNotFoundError(SnapshotError, LookupError):
    """No snapshot with that id is in the store."""


class SnapshotCorruptError(SnapshotError):
    """A stored layer or snapshot record no longer matches its digest.

    Attributes:
        layer_id: the layer that differs, or None when a record does.
        path: the first differing path inside the layer, if known.
    """

    def __init__(self, message: str, *, layer_id: str | None = None, path: str | None = None) -> None:
        super().__init__(message)
        self.layer_id = layer_id
        self.path = path


class SnapshotTooLargeError(SnapshotError):
    """A snapshot would store more than the backend's limit."""


class StoreFullError(SnapshotError):
    """The snapshot store's filesystem ran out of space (or quota) while writing."""


class SandboxError(SnapgymError):
    """A sandbox could not do what was asked."""


class SandboxClosedError(SandboxError):
    """The sandbox was used after close()."""


class SandboxCrashedError(SandboxError):
    """The sandbox's init process or the daemon hosting it died."""


class SandboxOutOfMemoryError(SandboxError, MemoryError):
    """The sandbox's own processes used up its memory and its init died: the agent's doing, not the host's."""


class SandboxEndedError(SandboxError):
    """The sandbox's own processes ended it: a cloud sandbox whose entrypoint exited (the agent killed
    it, or the kernel did for its memory) before the provider's lifetime. The agent's doing, not the
    provider's: the episode ends and is scored, with the outputs it can no longer give up empty."""


class CommandRejectedError(SandboxError, ValueError):
    """The command, environment or working directory cannot be passed to a sandbox."""


class FileOperationError(SandboxError, OSError):
    """Reading or writing a file inside the sandbox failed."""


class BackendError(SnapgymError):
    """The backend itself failed (daemon start, store, cleanup)."""


class ProviderBusyError(BackendError):
    """A cloud provider refused for now (429, 503, RESOURCE_EXHAUSTED) after its SDK's own retries."""


class HostBrokenError(BackendError):
    """A pool host's backend (its sandbox daemon) died; the host must be replaced."""


class PoolError(SnapgymError):
    """The sandbox pool cannot serve the request."""


class PoolClosedError(PoolError):
    """The pool was used after close()."""


class AcquireTimeoutError(PoolError, TimeoutError):
    """No sandbox became ready within the acquire timeout."""


class LeaseLostError(PoolError, SandboxCrashedError):
    """The lease is gone: its host died, or the pool reclaimed it after its holder stopped renewing."""


class CrashLoopError(PoolError):
    """Sandboxes of a snapshot keep failing, so the pool stopped recreating them."""
