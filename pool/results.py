"""The result of running a command in a sandbox."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class ExecResult:
    """What one ``sandbox.exec`` produced.

    A non-zero exit code is data, not an exception.
    """

    exit_code: int
    """The shell's exit status; 128+N when killed by signal N (137 on timeout)."""
    stdout: str
    """Standard output, decoded as UTF-8 with invalid bytes replaced."""
    stderr: str
    """Standard error, decoded the same way."""
    duration_s: float
    """Wall time from the request to the result."""
    timed_out: bool = False
    """True when the timeout killed the command and every process it started."""
    stdout_truncated: bool = False
    """True when stdout went past the cap and the rest was discarded."""
    stderr_truncated: bool = False
    """True when stderr went past the cap and the rest was discarded."""

    @property
    def ok(self) -> bool:
        """True when the command exited 0 within its timeout."""
        return self.exit_code == 0 and not self.timed_out

    @property
    def truncated(self) -> bool:
        """True when either stream was cut at the cap."""
        return self.stdout_truncated or self.stderr_truncated


def decode_output(data: bytes) -> str:
    """Decode command output; invalid UTF-8 never raises."""
    return data.decode("utf-8", errors="replace")


@dataclass(slots=True)
class CappedBuffer:
    """A command's output stream up to a cap, and whether anything past it was dropped.

    Every backend keeps output this way (pipes, the Docker helper's frames, a provider's
    streamed or returned text), so a flood costs the host at most ``cap`` bytes per stream.
    """

    cap: int
    chunks: list[bytes] = field(default_factory=list)
    size: int = 0
    truncated: bool = False

    def add(self, data: bytes) -> None:
        """Keep what fits under the cap, drop the rest."""
        room = self.cap - self.size
        if len(data) > room:
            data, self.truncated = data[: max(room, 0)], True
        if data:
            self.chunks.append(data)
            self.size += len(data)

    def add_text(self, text: str) -> None:
        """Keep what fits of ``text``, as UTF-8 (invalid code points kept as they came)."""
        self.add(text.encode("utf-8", "surrogateescape"))

    def value(self) -> bytes:
        """The kept bytes."""
        return b"".join(self.chunks)

    def text(self) -> str:
        """The kept bytes, decoded as :func:`decode_output` does."""
        return decode_output(self.value())
