"""A shell line that runs a command with each output stream cut at a cap inside the sandbox.

For providers whose exec returns the whole output at once (Daytona's sessions, Modal's
``exec``): the command's stdout and stderr go to files and at most ``cap`` bytes of each
come back, so the client never holds more, and a process the command left in the
background writes to a file, not to the provider's stream (which would otherwise wait
for it to end). The command runs in a subshell, so its ``exit`` ends only it.
"""

from __future__ import annotations

import shlex
import uuid
from collections.abc import Mapping

from pool.results import CappedBuffer

_SCRIPT = """cd {cwd} || exit 1
{exports}
out=$(mktemp /tmp/.snapgym-out.XXXXXX)
err=$(mktemp /tmp/.snapgym-err.XXXXXX)
( {command}
) >"$out" 2>"$err"
status=$?
head -c {cap} "$out"
head -c {cap} "$err" >&2
rm -f "$out" "$err"
exit $status"""


def capped_script(command: str, *, cwd: str, env: Mapping[str, str], cap: int) -> str:
    """A bash script running ``command`` in ``cwd`` with ``env``; each stream is cut at ``cap + 1`` bytes
    (one more than the cap, so the caller can tell a stream that reached it)."""
    exports = "\n".join(f"export {key}={shlex.quote(value)}" for key, value in env.items())
    return _SCRIPT.format(cwd=shlex.quote(cwd), exports=exports, command=command, cap=cap + 1)


def cut(stream: str | bytes, cap: int) -> tuple[str, bool]:
    """A stream of at most ``cap + 1`` bytes as (its first ``cap`` bytes, whether it had more), decoded
    as UTF-8 with invalid bytes replaced (a multibyte character cut at the cap included).

    Give the raw bytes where the SDK can return them: text an SDK decoded strictly raises on
    output that is not UTF-8 before it gets here."""
    kept = CappedBuffer(cap)
    if isinstance(stream, bytes):
        kept.add(stream)
    else:
        kept.add_text(stream)
    return kept.text(), kept.truncated


LONG_SCRIPT_BYTES = 48 << 10
"""A script longer than this goes to the sandbox as a file (:func:`run_from_file`): SDKs cap command
arguments (Modal at 64 KiB in the client) and the kernel one argument at 128 KiB, which a command of
the contract's maximum passes once wrapped."""


def script_file() -> str:
    """A fresh path in the sandbox for a long script."""
    return f"/tmp/.snapgym-script-{uuid.uuid4().hex}"


def run_from_file(path: str) -> str:
    """A short bash line that runs the script written at ``path`` and removes it first."""
    quoted = shlex.quote(path)
    return f"exec 9<{quoted} && rm -f {quoted} && exec bash /dev/fd/9"
