"""``python -m pool.egress.cache export DIR OUT.tar`` and ``import IN.tar DIR``: move a download cache."""

from __future__ import annotations

import argparse
import sys

from pool.egress.cache.archive import export, import_
from pool.errors import ConfigError


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m pool.egress.cache", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    out = commands.add_parser("export", help="write a cache folder to a tar (index, blobs, CA)")
    out.add_argument("dir")
    out.add_argument("tar")
    into = commands.add_parser("import", help="add a tar's entries to a cache folder (each blob checked)")
    into.add_argument("tar")
    into.add_argument("dir")
    args = parser.parse_args(argv)
    try:
        if args.command == "export":
            print(f"exported {export(args.dir, args.tar)} entries from {args.dir} to {args.tar}")
        else:
            print(f"imported {import_(args.tar, args.dir)} entries from {args.tar} into {args.dir}")
    except (ConfigError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
