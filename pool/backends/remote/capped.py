"""A shell line that runs a command with each output stream cut at a cap inside the sandbox.

For providers whose exec returns the whole output at once (Daytona's sessions, Modal's
``exec``): the command's stdout and stderr go to files and at most ``cap`` bytes of each
come back, so the client never holds more, and a process the command left in the
background writes to a file, not to the provider's stream (which would otherwise wait
for it to end). The command runs in a subshell, so its ``exit`` ends only it.
"""

from __future__ import annotations

import shlex
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


def cut(stream: str, cap: int) -> tuple[str, bool]:
    """A stream of at most ``cap + 1`` bytes as (its first ``cap`` bytes, whether it had more)."""
    kept = CappedBuffer(cap)
    kept.add_text(stream)
    return kept.text(), kept.truncated
