"""The recorded results of real runs, per backend: the conformance suite and the verifier-attack catalogue.

``docs/results/conformance.json`` holds them; the test suite writes it from the runs it makes
(``--record-conformance PATH``, tests/support/recording.py) and the documentation's backend-by-feature
table (:mod:`pool.backends.features`) reads it, and only it: no clock, no run. Format 1::

    {
      "format": 1,
      "conformance": [
        {"backend": "local", "where": "machine", "outcome": "passed", "check": null, "detail": null,
         "commit": "f72ad45…", "dirty": false, "date": "2026-12-05"}
      ],
      "attacks": [
        {"backend": "e2b", "where": "stand-in", "cases": 160, "played": 141,
         "beat_noop": [], "unscored": [], "failed": [],
         "commit": "f72ad45…", "dirty": false, "date": "2026-12-05"}
      ]
    }

One conformance entry and one attack entry at most per backend and ``where``: ``machine`` (this
machine: the local and Docker backends), ``stand-in`` (a cloud backend's real SDK against its provider's
stand-in server, tests/backends/cloud) or ``live`` (the provider itself, with credentials). A failed
conformance run names the failed ``check`` and why (``detail``, one line). An attack entry counts the
catalogue's (attack, task) cases, those played (not skipped or left out of the run), and names as
``attack on task`` those that scored other than the no-op agent, those left unscored and those that
failed otherwise (a hang, an error). ``commit`` is snapgym's commit that ran, ``dirty`` whether its
tree had changes beside it, ``date`` the run's day (UTC).
"""

from __future__ import annotations

import json
import re
import traceback
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from pool.errors import ConfigError
from pool.testing.expect import ConformanceError

FORMAT = 1
"""The format this snapgym writes and reads."""
WHERE = ("machine", "stand-in", "live")
"""Where a run can happen, in the order the table shows them."""
RESULTS_FILE = "docs/results/conformance.json"
"""The recorded results, relative to the repository."""
_DETAIL_CHARS = 240
_CHECKS_DIR = Path(__file__).resolve().parent
_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class Stamp:
    """Which snapgym ran, and when."""

    commit: str | None
    """snapgym's commit (None: not a git checkout)."""
    dirty: bool
    """The checkout had uncommitted changes beside the results file."""
    date: str
    """The run's day, ``YYYY-MM-DD`` (UTC)."""


@dataclass(frozen=True, slots=True)
class ConformanceResult:
    """One backend's conformance suite (:func:`pool.testing.check_backend`), run in one place."""

    backend: str
    where: str
    passed: bool
    check: str | None
    """The check that failed (None when it passed)."""
    detail: str | None
    """Why, on one line (None when it passed)."""
    stamp: Stamp


@dataclass(frozen=True, slots=True)
class AttackResult:
    """The verifier-attack catalogue played on one backend, in one place."""

    backend: str
    where: str
    cases: int
    """The catalogue's (attack, task) cases."""
    played: int
    """Those played in the run (the rest were skipped here or left out of the run, e.g. as ``slow``)."""
    beat_noop: tuple[str, ...]
    """``attack on task``: scored other than the no-op agent."""
    unscored: tuple[str, ...]
    """``attack on task``: the episode was not scored."""
    failed: tuple[str, ...]
    """``attack on task``: failed otherwise (a hang, an error)."""
    stamp: Stamp


@dataclass(frozen=True, slots=True)
class Results:
    """Everything recorded: at most one entry of each kind per (backend, where)."""

    conformance: tuple[ConformanceResult, ...] = ()
    attacks: tuple[AttackResult, ...] = ()

    def merged(self, newer: Results) -> Results:
        """These results with ``newer``'s entries in place of the ones of the same backend and where."""
        return Results(_merge(self.conformance, newer.conformance), _merge(self.attacks, newer.attacks))

    def for_backend(self, name: str) -> tuple[list[ConformanceResult], list[AttackResult]]:
        """A backend's entries, machine first, then stand-in, then live."""
        return _of(self.conformance, name), _of(self.attacks, name)


def failure(exc: BaseException) -> tuple[str, str]:
    """The check a failed conformance run stopped at, and why on one line.

    A :class:`ConformanceError` names its check; any other error is named by the innermost check
    function of the suite it escaped from (``check_fork`` -> ``fork``), its detail its type and message.
    """
    if isinstance(exc, ConformanceError):
        check, _, detail = str(exc).partition(": ")
        return one_line(check), one_line(detail or "")
    checks = [
        frame.name
        for frame in traceback.extract_tb(exc.__traceback__)
        if frame.name.startswith("check_") and Path(frame.filename).resolve().parent == _CHECKS_DIR
    ]
    check = checks[-1].removeprefix("check_").replace("_", " ") if checks else "check_backend"
    return check, one_line(f"{type(exc).__name__}: {exc}")


def one_line(text: str) -> str:
    """``text`` on one line of at most 240 characters."""
    flat = re.sub(r"\s+", " ", text).strip()
    return flat if len(flat) <= _DETAIL_CHARS else flat[: _DETAIL_CHARS - 1] + "…"


def load_results(path: Path) -> Results:
    """The results recorded in ``path`` (none where the file does not exist).

    Raises:
        ConfigError: the file is not format-1 JSON as :mod:`pool.testing.record` describes; the
            message names the file and the problem.
    """
    if not path.exists():
        return Results()
    try:
        data = json.loads(path.read_text())
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            found = data.get("format") if isinstance(data, dict) else type(data).__name__
            raise ValueError(f"its format is {found!r}; this snapgym reads format {FORMAT}")
        conformance = tuple(_conformance(entry) for entry in _list(data, "conformance"))
        attacks = tuple(_attack(entry) for entry in _list(data, "attacks"))
    except (ValueError, TypeError, KeyError) as exc:
        raise ConfigError(
            f"the recorded results {path} cannot be read ({exc}); record them again with the test suite's "
            f"--record-conformance {path} (docs/backends/capabilities.md says how), or restore the file from git"
        ) from exc
    return Results().merged(Results(conformance, attacks))


def save_results(path: Path, results: Results) -> None:
    """Write ``results`` to ``path`` in format 1 (sorted, so the file changes only where a run did)."""
    data = {
        "format": FORMAT,
        "conformance": [_plain(entry) for entry in _sorted(results.conformance)],
        "attacks": [_plain(entry) for entry in _sorted(results.attacks)],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n")


def _plain(entry: ConformanceResult | AttackResult) -> dict[str, Any]:
    if isinstance(entry, ConformanceResult):
        outcome = "passed" if entry.passed else "failed"
        head: dict[str, Any] = {"outcome": outcome, "check": entry.check, "detail": entry.detail}
    else:
        lists = {"beat_noop": list(entry.beat_noop), "unscored": list(entry.unscored), "failed": list(entry.failed)}
        head = {"cases": entry.cases, "played": entry.played, **lists}
    stamp = {"commit": entry.stamp.commit, "dirty": entry.stamp.dirty, "date": entry.stamp.date}
    return {"backend": entry.backend, "where": entry.where, **head, **stamp}


def _conformance(entry: Mapping[str, Any]) -> ConformanceResult:
    outcome = _get(entry, "outcome", str)
    if outcome not in ("passed", "failed"):
        raise ValueError(f"outcome {outcome!r} is neither 'passed' nor 'failed'")
    passed = outcome == "passed"
    check, detail = _get(entry, "check", (str, type(None))), _get(entry, "detail", (str, type(None)))
    if not passed and check is None:
        raise ValueError(f"a failed run of {entry['backend']!r} names no check")
    return ConformanceResult(_get(entry, "backend", str), _where(entry), passed, check, detail, _stamp(entry))


def _attack(entry: Mapping[str, Any]) -> AttackResult:
    cases, played = _get(entry, "cases", int), _get(entry, "played", int)
    if not 0 <= played <= cases:
        raise ValueError(f"{played} cases played of {cases}")
    beat, unscored, failed = (tuple(_strings(entry, key)) for key in ("beat_noop", "unscored", "failed"))
    return AttackResult(
        _get(entry, "backend", str), _where(entry), cases, played, beat, unscored, failed, _stamp(entry)
    )


def _stamp(entry: Mapping[str, Any]) -> Stamp:
    date = _get(entry, "date", str)
    if not re.fullmatch(r"\d{4}-\d\d-\d\d", date):
        raise ValueError(f"date {date!r} is not YYYY-MM-DD")
    return Stamp(_get(entry, "commit", (str, type(None))), _get(entry, "dirty", bool), date)


def _where(entry: Mapping[str, Any]) -> str:
    where: str = _get(entry, "where", str)
    if where not in WHERE:
        raise ValueError(f"where {where!r} is none of {', '.join(WHERE)}")
    return where


def _get(entry: Mapping[str, Any], key: str, kind: type[_T] | tuple[type, ...]) -> Any:
    if not isinstance(entry, Mapping) or key not in entry:
        raise ValueError(f"an entry has no {key!r}: {entry!r}"[:200])
    value = entry[key]
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):
        raise ValueError(f"{key!r} is {value!r}, not {getattr(kind, '__name__', kind)}")
    return value


def _list(data: Mapping[str, Any], key: str) -> list[Any]:
    value = data.get(key, [])
    if not isinstance(value, list):
        raise ValueError(f"{key!r} is not a list")
    return value


def _strings(entry: Mapping[str, Any], key: str) -> list[str]:
    value = _get(entry, key, list)
    if not all(isinstance(item, str) for item in value):
        raise ValueError(f"{key!r} holds something other than text")
    return list(value)


_E = TypeVar("_E", ConformanceResult, AttackResult)


def _merge(older: Iterable[_E], newer: Iterable[_E]) -> tuple[_E, ...]:
    by_key = {(entry.backend, entry.where): entry for entry in older}
    by_key.update({(entry.backend, entry.where): entry for entry in newer})
    return tuple(_sorted(by_key.values()))


def _sorted(entries: Iterable[_E]) -> list[_E]:
    return sorted(entries, key=lambda entry: (entry.backend, WHERE.index(entry.where)))


def _of(entries: Iterable[_E], name: str) -> list[_E]:
    return _sorted(entry for entry in entries if entry.backend == name)
