"""The run viewer behind ``python -m benchmarks.view``: a local web page of one run directory.

- ``access``: reading the run directory's files by relative path, never outside it.
- ``reader``: the run's state (finished, incomplete, in progress), headline and episode rows.
- ``episode``: one episode's page data (steps, verifier, end-state diff, network audit).
- ``server``: the HTTP server (``Viewer``) and its routes; ``static/``: the pages.

What an agent wrote (actions, outputs, messages, file names) reaches the
browser as JSON strings and is shown as text, never parsed as HTML.
"""

from __future__ import annotations

from benchmarks.viewer.access import RefusedPathError, RunFiles
from benchmarks.viewer.reader import NotARunDirError, RunReader, check_run_dir
from benchmarks.viewer.server import Viewer

__all__ = ["NotARunDirError", "RefusedPathError", "RunFiles", "RunReader", "Viewer", "check_run_dir"]
