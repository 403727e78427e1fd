"""``--record-conformance PATH``: a test run records, per backend, how the conformance suite and the
verifier-attack catalogue went on it, into PATH (format 1, :mod:`pool.testing.record`).

No test changes for it. With the option, :func:`pool.testing.check_backend` is wrapped for the
session (before the test modules import it): each call, in whichever test, notes on that test's report
which backend it checked, where, and how it ended, and returns or raises as before; check_backend itself
writes nothing. Where: ``machine`` for a backend that is not a cloud one, ``stand-in`` for a cloud
backend in a test that starts its provider's stand-in (a ``*_standin`` fixture), else ``live``. Each case
of the attack catalogue (tests/attacks/test_verifier_attacks.py, read, not changed) carries its backend,
attack and task, and its report says how it ended, told apart by the test's own assertion messages.

The process that reports (xdist's controller, or the only one) gathers what the reports carry and, when
the session ends, merges it into PATH under a lock: the entry of each (backend, where) this run
checked replaces the old one, the rest of the file stays. An interrupted run records nothing, and a
file that cannot be read stops the run before anything runs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import fcntl
import functools
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import pool.testing
from pool.backends import BACKENDS, backend_class
from pool.errors import ConfigError
from pool.testing.record import AttackResult, ConformanceResult, Results, Stamp, failure, load_results, save_results

OPTION = "--record-conformance"
CONFORMANCE = "snapgym.conformance"
ATTACK = "snapgym.attack"
"""The user properties a report carries its results in."""
ATTACK_TEST = ("test_verifier_attacks.py", "test_attack_scores_what_doing_nothing_scores")
"""The catalogue's test: each case an attack played on a task on a backend (tests/attacks)."""
UNSCORED = "the episode was not scored"
BEAT = ", the no-op agent "
"""How that test's assertion messages begin: an unscored episode, a reward other than the no-op agent's."""
ROOT = Path(__file__).resolve().parents[2]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        OPTION,
        metavar="PATH",
        type=Path,
        help="record how check_backend and the attack catalogue went on each backend into PATH "
        "(docs/results/conformance.json; format: pool/testing/record.py)",
    )


def pytest_configure(config: pytest.Config) -> None:
    path: Path | None = config.getoption(OPTION, None)
    if path is None:
        return
    if path.exists() and path.stat().st_size:
        try:
            load_results(path)
        except ConfigError as exc:
            raise pytest.UsageError(str(exc)) from None
    config.pluginmanager.register(Recorder(path.resolve(), reports=not hasattr(config, "workerinput")), "snapgym-rec")


class Recorder:
    """Wraps check_backend, marks the catalogue's cases, gathers the reports and writes the file."""

    def __init__(self, path: Path, *, reports: bool) -> None:
        self.path = path
        self.reports = reports
        """Whether this process gathers the reports and writes (not an xdist worker)."""
        self.item: pytest.Item | None = None
        self.conformance: dict[tuple[str, str], ConformanceResult] = {}
        self.attacks: dict[tuple[str, str], dict[str, Any]] = {}
        self.stamp = NO_STAMP
        self.original = pool.testing.check_backend
        pool.testing.check_backend = self.wrap(self.original)

    def pytest_unconfigure(self) -> None:
        pool.testing.check_backend = self.original

    def wrap(self, check_backend: Callable[..., None]) -> Callable[..., None]:
        @functools.wraps(check_backend)
        def recorded(backend: Any, **options: Any) -> None:
            outcome: dict[str, Any] = {"passed": True, "check": None, "detail": None}
            try:
                check_backend(backend, **options)
            except BaseException as exc:
                check, detail = failure(exc)
                outcome = {"passed": False, "check": check, "detail": detail}
                raise
            finally:
                self.note(backend, outcome)

        return recorded

    def note(self, backend: Any, outcome: dict[str, Any]) -> None:
        name = backend_name(backend)
        if name is None or self.item is None:
            return
        cloud = is_cloud(backend)
        standin = any(fixture.endswith("_standin") for fixture in getattr(self.item, "fixturenames", ()))
        where = ("stand-in" if standin else "live") if cloud else "machine"
        self.item.user_properties.append((CONFORMANCE, {"backend": name, "where": where, **outcome}))

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item) -> Iterator[None]:
        self.item = item
        try:
            return (yield)
        finally:
            self.item = None

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        for item in items:
            if (item.path.name, getattr(item, "originalname", "")) != ATTACK_TEST:
                continue
            params = item.callspec.params  # type: ignore[attr-defined]
            name = str(params["arena"])
            where = "stand-in" if name in getattr(item.module, "STANDINS", ()) else "machine"  # type: ignore[attr-defined]
            case = f"{params['attack'].name} on {params['task_id']}"
            cases = len(item.module.cases())  # type: ignore[attr-defined]
            item.user_properties.append((ATTACK, {"backend": name, "where": where, "case": case, "cases": cases}))

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if not self.reports:
            return
        for key, value in report.user_properties:
            if key == CONFORMANCE and report.when == "teardown":
                self.add_conformance(value)
            elif key == ATTACK and (report.when == "call" or (report.when == "setup" and report.failed)):
                self.add_attack(value, report)

    def add_conformance(self, found: dict[str, Any]) -> None:
        """A check_backend call; of several on one backend and where, the first failure counts."""
        key = (found["backend"], found["where"])
        earlier = self.conformance.get(key)
        if earlier is not None and not earlier.passed:
            return
        self.conformance[key] = ConformanceResult(*key, found["passed"], found["check"], found["detail"], NO_STAMP)

    def add_attack(self, found: dict[str, Any], report: pytest.TestReport) -> None:
        tally = self.attacks.setdefault((found["backend"], found["where"]), {"cases": found["cases"], "played": 0})
        xfailed = hasattr(report, "wasxfail")
        if report.skipped and not xfailed:
            return
        tally["played"] += 1
        if report.passed:
            return
        text = str(report.longrepr)
        kind = "unscored" if UNSCORED in text else "beat_noop" if BEAT in text else "failed"
        tally.setdefault(kind, []).append(found["case"])

    def pytest_sessionstart(self) -> None:
        self.stamp = run_stamp(self.path) if self.reports else NO_STAMP  # the code as it starts is what runs

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if not self.reports or not (self.conformance or self.attacks):
            return
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if exitstatus == pytest.ExitCode.INTERRUPTED:  # a part of a run would pass for the whole
            if reporter is not None:
                reporter.write_sep("-", f"the run was interrupted: nothing recorded in {self.path}")
            return
        stamp = self.stamp
        conformance = tuple(dataclasses.replace(entry, stamp=stamp) for entry in self.conformance.values())
        attacks = tuple(
            AttackResult(backend, where, tally["cases"], tally["played"],
                         *(tuple(sorted(tally.get(kind, []))) for kind in ("beat_noop", "unscored", "failed")), stamp)
            for (backend, where), tally in self.attacks.items()
        )  # fmt: skip
        with locked(self.path):
            old = load_results(self.path) if self.path.stat().st_size else Results()
            save_results(self.path, old.merged(Results(conformance, attacks)))
        if reporter is not None:
            done = sorted({f"{b} ({w})" for b, w in [*self.conformance, *self.attacks]})
            reporter.write("\n")  # the progress line may still be open
            reporter.write_sep("-", f"recorded the results of {', '.join(done)} in {self.path}")


NO_STAMP = Stamp(None, False, "1970-01-01")
"""A placeholder until the session's end gives the run's stamp."""


def backend_name(backend: Any) -> str | None:
    """The name under which pool knows the backend's class (or a class it derives from), if any."""
    for name in BACKENDS:
        with contextlib.suppress(ConfigError):  # its SDK is not installed: it is not this backend
            if isinstance(backend, backend_class(name)):
                return name
    return None


def is_cloud(backend: Any) -> bool:
    """Whether the backend runs its sandboxes at a provider (the cloud backends' shared base)."""
    from pool.backends.remote.backend import RemoteBackend

    return isinstance(backend, RemoteBackend)


def run_stamp(results: Path) -> Stamp:
    """snapgym's commit, whether its checkout has other changes than ``results``, and today (UTC)."""
    today = datetime.datetime.now(datetime.UTC).date().isoformat()
    head = _git("rev-parse", "HEAD")
    if head is None:
        return Stamp(None, False, today)
    exclude = [f":(exclude){results.relative_to(ROOT)}"] if results.is_relative_to(ROOT) else []
    changes = _git("status", "--porcelain", "--", ".", *exclude)
    return Stamp(head, bool(changes), today)


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` (made empty if missing): two runs recording at once merge in turn."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield
