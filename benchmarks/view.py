"""The run viewer: ``python -m benchmarks.view RUN_DIR [--host 127.0.0.1] [--port 8765]``.

Serves a local web page of one run directory (see ``benchmarks.viewer``): the
run's summary, plots and episode table, and a page per episode with its
steps, verifier output, end-state diff and network audit. The page follows a
run in progress until it finishes. It binds to 127.0.0.1 by default; every
file it serves comes from the run directory or the package, nothing from
the internet.

Examples:
    python -m benchmarks.view outputs/2026-12-02/10-00-00-eval
    python -m benchmarks.view outputs/2026-12-02/10-00-00-eval --port 0   # any free port
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from benchmarks.viewer import NotARunDirError, Viewer

DESCRIPTION = (
    "Serve a local web page of a run directory: its summary, plots and episodes, and each episode's steps, "
    "verifier output, end-state diff and network audit. It follows a run in progress until it finishes."
)
EXIT_USAGE = 2
"""Exit status when RUN_DIR is not a run directory or the address cannot be bound."""


def main(argv: Sequence[str] | None = None) -> None:
    """Parse the command line and serve until interrupted."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.view", description=DESCRIPTION)
    parser.add_argument("run_dir", metavar="RUN_DIR", type=Path, help="a run directory (outputs/<date>/<time>-eval)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8765, help="port to listen on (default: 8765; 0: any free port)")
    args = parser.parse_args(argv)
    try:
        viewer = Viewer(args.run_dir, host=args.host, port=args.port)
    except NotARunDirError as exc:
        _fail(str(exc))
    except OSError as exc:
        taken = exc.errno == errno.EADDRINUSE
        why = "it is in use; give another --port (0: any free port)" if taken else exc.strerror or str(exc)
        _fail(f"cannot listen on {args.host}:{args.port}: {why}")
    if not viewer.is_loopback:
        print(f"snapgym view: listening on {args.host}: whoever reaches it reads this run", file=sys.stderr)
    with viewer:
        print(f"snapgym viewer: {viewer.reader.run_dir} at {viewer.url} (Ctrl-C stops it)", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            viewer.serve_forever()


def _fail(message: str) -> NoReturn:
    print(f"snapgym view: {message}", file=sys.stderr)
    sys.exit(EXIT_USAGE)


if __name__ == "__main__":
    main()
