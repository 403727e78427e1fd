"""``python -m pool.backends``: what each backend does on this machine, as a Markdown table.

Each backend that can run here is opened with its default options and its
``Capabilities`` printed (the README's table comes from this); one that cannot
run is listed with the reason, and with the capabilities it declares without
being opened (a cloud backend's, which need no credentials to state). Nothing is
built and no sandbox starts.
"""

from __future__ import annotations

import sys

from pool.backends import BACKENDS, backend_class, load_backend, unavailable_reason


def capability_table() -> str:
    """The Markdown table: one column per backend, one row per capability."""
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


if __name__ == "__main__":
    sys.stdout.write(capability_table() + "\n")
