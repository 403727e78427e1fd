"""An SDK's exceptions translated into snapgym's error tree by a table: :class:`Rule` and :func:`translated`.

Each cloud backend's ``errors.py`` is a table of rules (in the order an
``except`` chain would try them) and a ``provider_errors(what)`` context that
applies it, so nothing above a provider adapter sees an SDK's exception: a
caller can tell a configuration fault (fix it) from a crashed sandbox (replace
it) from an outage (retry). An exception no rule names passes through.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno as errnos
from collections.abc import Callable, Iterator, Sequence

from pool.errors import FileOperationError, SnapgymError


@dataclasses.dataclass(frozen=True, slots=True)
class Rule:
    """How one kind of SDK exception becomes snapgym's. Messages are formatted with ``what`` (the
    operation), ``exc`` (the SDK's exception) and ``kind`` (its class name)."""

    sdk: type[BaseException] | tuple[type[BaseException], ...]
    error: type[SnapgymError]
    message: str
    errno: int = errnos.EIO
    """The errno when ``error`` is :class:`~pool.errors.FileOperationError`."""
    file_errno: int | None = None
    """During a file operation, a FileOperationError with this errno instead of ``error`` (None: ``error``)."""
    file_message: str = "{what}: {exc}"
    when: Callable[[BaseException], bool] | None = None
    """Only the exceptions this accepts (None: all of ``sdk``)."""

    def matches(self, exc: BaseException) -> bool:
        """Whether this rule translates ``exc``."""
        return isinstance(exc, self.sdk) and (self.when is None or self.when(exc))

    def translate(self, exc: BaseException, what: str, *, file_operation: bool) -> SnapgymError:
        """snapgym's error for ``exc`` raised while doing ``what``."""
        fields = {"what": what, "exc": exc, "kind": type(exc).__name__}
        if file_operation and self.file_errno is not None:
            return FileOperationError(self.file_errno, self.file_message.format(**fields))
        if issubclass(self.error, FileOperationError):
            return FileOperationError(self.errno, self.message.format(**fields))
        return self.error(self.message.format(**fields))


@contextlib.contextmanager
def translated(rules: Sequence[Rule], what: str, *, file_operation: bool = False) -> Iterator[None]:
    """Raise snapgym's error for an SDK exception raised inside (the first rule that matches), without the
    SDK's traceback chained; anything no rule matches passes through."""
    try:
        yield
    except Exception as exc:
        rule = next((rule for rule in rules if rule.matches(exc)), None)
        if rule is None:
            raise
        raise rule.translate(exc, what, file_operation=file_operation) from None
