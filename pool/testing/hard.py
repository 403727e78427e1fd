"""The conformance suite's hard inputs: what an SDK or a wire format gets wrong first.

Output that is not UTF-8 and a multibyte character cut by the output cap (an SDK that
decodes strictly raises on them), a file of more than 1 MiB (an SDK that carries files in
command arguments refuses it), and a command of the documented maximum length (128 KiB;
an SDK may cap arguments lower).
"""

from __future__ import annotations

import hashlib

from pool.contract import Sandbox
from pool.testing.expect import ConformanceError, expect

MAX_COMMAND_BYTES = (128 << 10) - 1
"""The longest command every backend runs: 128 KiB (docs/contract.md) less the kernel's NUL
(``MAX_ARG_STRLEN``), the local and Docker backends' limit."""

LARGE_FILE_BYTES = (1 << 20) + 4099
"""A task file of more than 1 MiB, not a multiple of any chunk size."""


def check_hard_inputs(sandbox: Sandbox) -> None:
    """Run every hard-input check against ``sandbox``."""
    check_invalid_output(sandbox)
    check_large_file(sandbox)
    check_long_command(sandbox)


def check_invalid_output(sandbox: Sandbox) -> None:
    """Output that is not UTF-8 comes back with the bad bytes replaced, on both streams; a
    multibyte character cut by the cap is replaced too, and the result says it was cut."""
    r = sandbox.exec("printf 'ok\\377\\376\\n'; printf 'e\\377\\n' >&2")
    expect(r.exit_code == 0, "invalid UTF-8", repr(r))
    expect(r.stdout == "ok\ufffd\ufffd\n", "invalid UTF-8", f"stdout must replace bad bytes: {r.stdout!r}")
    expect(r.stderr == "e\ufffd\n", "invalid UTF-8", f"stderr must replace bad bytes: {r.stderr!r}")
    try:
        r = sandbox.exec("printf 'ab\\342\\202\\254\\342\\202\\254'", max_output_bytes=4)
    except Exception as exc:
        raise ConformanceError(f"a multibyte character cut by the output cap raised {exc!r}") from exc
    expect(r.stdout_truncated and r.stdout in ("ab", "ab\ufffd"), "multibyte character cut by the cap", repr(r))


def check_large_file(sandbox: Sandbox) -> None:
    """A file of more than 1 MiB is written and read back byte for byte, and a command sees it whole."""
    payload = hashlib.shake_256(b"snapgym-conformance").digest(LARGE_FILE_BYTES)
    sandbox.write_file("/workspace/large.bin", payload)
    expect(sandbox.read_file("/workspace/large.bin") == payload, "large file", "the read differs from the write")
    r = sandbox.exec("wc -c < /workspace/large.bin; sha256sum /workspace/large.bin")
    want = f"{LARGE_FILE_BYTES}\n{hashlib.sha256(payload).hexdigest()}  /workspace/large.bin\n"
    expect(r.stdout == want, "large file", f"the sandbox sees {r.stdout!r}, not {want!r}")
    sandbox.exec("rm -f /workspace/large.bin")


def check_long_command(sandbox: Sandbox) -> None:
    """A command of the documented maximum length runs."""
    head, tail = ": '", "'; echo long-command-ran"
    command = head + "x" * (MAX_COMMAND_BYTES - len(head) - len(tail)) + tail
    r = sandbox.exec(command, timeout_s=60)
    expect(r.stdout == "long-command-ran\n", "a command of 128 KiB", repr(r)[:300])
