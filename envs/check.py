"""Check tasks from the command line: the reference solution scores 1.0, doing nothing 0.0.

``python -m envs.check [--verbose] [TASK_ID_OR_DIR ...]`` (default: the built-in suite).
Exits non-zero when any task fails, printing the verifier's output.
"""

from __future__ import annotations

import argparse
import sys

from envs.oracle import TaskCheck, check_task
from envs.tasks import builtin_task_ids, load_task
from pool.backends.local import LocalBackend


def main(argv: list[str] | None = None) -> int:
    """Check the tasks named on the command line."""
    parser = argparse.ArgumentParser(prog="python -m envs.check", description=__doc__)
    parser.add_argument("tasks", nargs="*", help="task ids or directories (default: every built-in task)")
    parser.add_argument("--verbose", "-v", action="store_true", help="print the verifier's output for every task")
    args = parser.parse_args(argv)
    failed = 0
    with LocalBackend() as backend:
        for spec in args.tasks or builtin_task_ids():
            check = check_task(backend, load_task(spec))
            print(f"{'ok  ' if check.ok else 'FAIL'} {check.task_id:32s} oracle={check.oracle.reward} "
                  f"noop={check.noop.reward} build={check.build_s:.2f}s")  # fmt: skip
            if not check.ok or args.verbose:
                _print_details(check)
            failed += not check.ok
    return 1 if failed else 0


def _print_details(check: TaskCheck) -> None:
    for name, verdict in (("oracle", check.oracle), ("noop", check.noop)):
        print(f"  {name}: reward={verdict.reward} error={verdict.error} exit={verdict.exit_code}")
        print("    " + verdict.output[-2000:].replace("\n", "\n    "))


if __name__ == "__main__":
    sys.exit(main())
