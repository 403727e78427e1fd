"""``python -m pool.backends.reap``: find and destroy what runs left behind on a backend.

    python -m pool.backends.reap --backend e2b               # sandboxes of snapgym processes here that are gone
    python -m pool.backends.reap --backend e2b --run RUN_ID  # every sandbox labelled with that run, wherever made
    python -m pool.backends.reap --backend e2b --run RUN_ID --dry-run   # list them only
    python -m pool.backends.reap --backend docker --run RUN_ID  # its containers, and a killed run's checkpoints

Without ``--run`` this is the backend's ``reap_orphans()``: sandboxes whose owner
process (``snapgym.owner``: host, boot, pid) no longer runs on this machine.
A runner killed on another machine, or one whose machine is gone, is found by
its run instead (the run id is the name of its output folder; every sandbox of
a run carries ``snapgym.run``): only backends whose sandboxes can be listed by
label offer that (``reap_run``). A provider-side lifetime ends every cloud
sandbox anyway; this ends them now and stops the bill.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from pool.backends import load_backend
from pool.contract import ReapsRuns
from pool.errors import ConfigError, SnapgymError


def main(argv: Sequence[str] | None = None) -> int:
    """The command line; the exit status."""
    parser = argparse.ArgumentParser(prog="python -m pool.backends.reap", description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", required=True, help="local, docker, e2b, ...")
    parser.add_argument("--run", help="destroy every sandbox labelled with this run id (snapgym.run)")
    parser.add_argument("--dry-run", action="store_true", help="with --run: list, destroy nothing")
    parser.add_argument("-o", "--option", action="append", default=[], metavar="KEY=VALUE",
                        help="a backend option (e.g. -o api_url=http://...), repeatable")  # fmt: skip
    args = parser.parse_args(argv)
    try:
        options = _options(args.option)
        backend = load_backend(args.backend, **options)
    except SnapgymError as exc:
        print(f"pool.backends.reap: {exc}", file=sys.stderr)
        return 2
    try:
        if args.run is None:
            if args.dry_run:
                print("pool.backends.reap: --dry-run goes with --run", file=sys.stderr)
                return 2
            print(f"reaped the leftovers of {backend.reap_orphans()} run(s) whose process is gone")
            return 0
        if not isinstance(backend, ReapsRuns):
            print(f"pool.backends.reap: the {args.backend} backend cannot list its sandboxes by run; "
                  "run it without --run on the machine that ran it", file=sys.stderr)  # fmt: skip
            return 2
        found = backend.reap_run(args.run, dry_run=args.dry_run)
        verb = "would destroy" if args.dry_run else "destroyed"
        for sandbox_id in found:
            print(sandbox_id)
        sandboxes = [entry for entry in found if not entry.startswith("checkpoint ")]
        checkpoints = f" and {len(found) - len(sandboxes)} checkpoint(s)" if len(found) > len(sandboxes) else ""
        print(f"{verb} {len(sandboxes)} sandbox(es){checkpoints} of run {args.run}")
        return 0
    except SnapgymError as exc:
        print(f"pool.backends.reap: {exc}", file=sys.stderr)
        return 1
    finally:
        backend.close()


def _options(pairs: Sequence[str]) -> dict[str, Any]:
    options: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ConfigError(f"a backend option is KEY=VALUE, got {pair!r}")
        options[key] = value
    return options


if __name__ == "__main__":
    sys.exit(main())
