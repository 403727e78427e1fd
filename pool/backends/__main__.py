"""``python -m pool.backends``: what each backend does, as a Markdown table.

Without options: on this machine. Each backend that can run here is opened with its default options
and its ``Capabilities`` printed; one that cannot run is listed with the reason, and with the
capabilities it declares without being opened (a cloud backend's, which need no credentials to
state). Nothing is built and no sandbox starts.

``--declared``: the documentation's backend-by-feature table instead, from what each backend class
declares (no backend is opened; see :mod:`pool.backends.features`), with the conformance results
recorded in ``docs/results/conformance.json`` (``--results FILE``: another file). ``--markdown PAGE``:
write that table between the markers of ``PAGE`` (``docs/backends/capabilities.md``), the rest of the
page as it is.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pool.backends import BACKENDS, backend_class, load_backend, unavailable_reason
from pool.backends.features import RESULTS, feature_table, splice
from pool.errors import ConfigError


def capability_table() -> str:
    """The Markdown table on this machine: one column per backend, one row per capability."""
    columns: dict[str, dict[str, str]] = {}
    for name in BACKENDS:
        reason = unavailable_reason(name)
        if reason is not None:
            declared = getattr(backend_class(name), "declared_capabilities", None)
            columns[name] = {"available here": f"no: {reason}", **(declared().table_row() if declared else {})}
            continue
        backend = load_backend(name)
        try:
            columns[name] = {"available here": "yes", **backend.capabilities.table_row()}
        finally:
            backend.close()
    rows = list(dict.fromkeys(row for column in columns.values() for row in column))
    lines = ["| | " + " | ".join(f"`{name}`" for name in columns) + " |", "|---" * (len(columns) + 1) + "|"]
    for row in rows:
        lines.append(f"| {row} | " + " | ".join(columns[name].get(row, "") for name in columns) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Print a table, or write the declared one into a page; the exit status."""
    parser = argparse.ArgumentParser(prog="python -m pool.backends", description=__doc__.split("\n\n")[0])
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--declared", action="store_true", help="the backend-by-feature table the classes declare")
    which.add_argument("--markdown", metavar="PAGE", type=Path, help="write that table between PAGE's markers")
    shown = "the recorded conformance results the declared table shows (default: %(default)s)"
    parser.add_argument("--results", metavar="FILE", type=Path, default=RESULTS, help=shown)
    args = parser.parse_args(argv)
    try:
        if args.markdown is not None:
            page: Path = args.markdown
            page.write_text(splice(page.read_text(), feature_table(results=args.results)))
            sys.stdout.write(f"wrote the backend-by-feature table into {page}\n")
        else:
            sys.stdout.write(feature_table(results=args.results) if args.declared else capability_table() + "\n")
    except ConfigError as exc:
        sys.stderr.write(f"python -m pool.backends: {exc}\n")
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
