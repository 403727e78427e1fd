"""The recorded conformance results (pool.testing.record): the test suite's ``--record-conformance``
writes what a real run did, the backend-by-feature table shows what is recorded, and a file that
cannot be read is named, never a traceback."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from pool import LocalBackend, Snapshot
from pool.backends.__main__ import main
from pool.backends.features import feature_table
from pool.errors import ConfigError
from pool.testing import check_exec
from pool.testing.record import AttackResult, ConformanceResult, Results, Stamp, failure, load_results, save_results
from tests.support.recording import OPTION

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[2]
STAMP = Stamp("0123456789abcdef0123456789abcdef01234567", False, "2026-12-05")
BROKEN = textwrap.dedent(
    """
    import dataclasses

    from pool import LocalBackend
    from pool.capabilities import Capabilities, ChangesSource
    from pool.testing import check_backend


    class EngineChanges(LocalBackend):
        \"\"\"The local backend declaring that its engine lists the end-state changes (the host does).\"\"\"

        @property
        def capabilities(self) -> Capabilities:
            return dataclasses.replace(super().capabilities, changes=ChangesSource.ENGINE)


    def test_the_broken_declaration(tmp_path):
        with EngineChanges(store_dir=tmp_path / "store", memory_limit_mb=256, pids_limit=128, disk_limit_mb=64) as b:
            check_backend(b)
    """
)


def row(table: str, name: str) -> list[str]:
    """The cells of a table row, by the row's name."""
    line = next(line for line in table.splitlines() if line.startswith(f"| {name} |"))
    return [cell.strip() for cell in line.strip("|").split("|")][1:]


def test_a_run_records_the_check_a_broken_declaration_fails(pytester: pytest.Pytester, tmp_path: Path) -> None:
    """A local backend declaring a capability it does not have fails check_backend; the record names the
    check and why, beside the entries of an earlier run, which stay."""
    record = tmp_path / "conformance.json"
    earlier = ConformanceResult("e2b", "stand-in", True, None, None, STAMP)
    save_results(record, Results(conformance=(earlier,)))
    pytester.makepyfile(test_broken=BROKEN)
    result = pytester.runpytest("-p", "tests.support.recording", OPTION, str(record), "-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    recorded = load_results(record)
    local = next(entry for entry in recorded.conformance if entry.backend == "local")
    assert (local.where, local.passed, local.check) == ("machine", False, "changes")
    assert local.detail and "\n" not in local.detail and "host" in local.detail
    assert local.stamp.date.count("-") == 2 and local.stamp.commit and len(local.stamp.commit) == 40
    assert earlier in recorded.conformance
    assert "failed: changes" in row(feature_table(results=record), "conformance")[0]


def test_a_run_records_the_attack_cases_it_played(pytester: pytest.Pytester, tmp_path: Path) -> None:
    """The catalogue's own test (tests/attacks, unchanged) on the local backend, two cases of it."""
    record = tmp_path / "conformance.json"
    catalogue = ROOT / "tests/attacks/test_verifier_attacks.py"
    pytester.chdir()
    result = pytester.runpytest(
        f"--rootdir={ROOT}", "-c", str(ROOT / "pyproject.toml"), "-n", "0", "-p", "no:cacheprovider", "-m", "",
        OPTION, str(record), str(catalogue), "-k", "local and reward-symlink and config-rewrite",
    )  # fmt: skip
    result.assert_outcomes(passed=1)
    (attacks,) = load_results(record).attacks
    assert (attacks.backend, attacks.where, attacks.played) == ("local", "machine", 1)
    assert attacks.cases > 1 and not (attacks.beat_noop or attacks.unscored or attacks.failed)


def test_an_error_inside_a_check_is_named_by_that_check(backend: LocalBackend, snap: Snapshot) -> None:
    """Not a ConformanceError: the check function it escaped from names it, the error's type says why."""
    sandbox = backend.create(snap)
    sandbox.close()
    with pytest.raises(Exception) as raised:
        check_exec(sandbox)
    check, detail = failure(raised.value)
    assert check == "exec" and detail.startswith("SandboxClosedError: ")


def test_the_table_shows_what_is_recorded_and_not_recorded_elsewhere(tmp_path: Path) -> None:
    record = tmp_path / "conformance.json"
    results = Results(
        conformance=(
            ConformanceResult("e2b", "stand-in", True, None, None, STAMP),
            ConformanceResult("e2b", "live", False, "network", "no-network let a request out", STAMP),
            ConformanceResult("docker", "machine", True, None, None, Stamp("fedcba9876", True, "2026-12-04")),
        ),
        attacks=(AttackResult("e2b", "stand-in", 40, 36, ("disk-fill on fix-python-stats",), (), (), STAMP),),
    )
    save_results(record, results)
    table = feature_table(results=record)
    local, docker, e2b, daytona, _ = row(table, "conformance")
    assert (local, daytona) == ("not recorded", "not recorded")
    assert docker == "passed · machine · 2026-12-04 `fedcba9`+"
    assert e2b.startswith("passed · stand-in · 2026-12-05 `0123456` / failed: network")
    assert e2b.endswith(" · live · 2026-12-05 `0123456`")
    attacks = row(table, "attack catalogue")
    assert attacks[2].startswith("36 of 40 played, 1 beat no-op, 0 unscored") and attacks[0] == "not recorded"
    assert "no-network let a request out" in table and "disk-fill on fix-python-stats" in table
    assert feature_table(results=record) == table
    assert set(row(feature_table(results=tmp_path / "missing.json"), "conformance")) == {"not recorded"}


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("{not json", "Expecting property name"),
        (json.dumps({"format": 2}), "its format is 2"),
        (json.dumps({"format": 1, "conformance": [{"backend": "local"}]}), "has no 'outcome'"),
        (json.dumps({"format": 1, "conformance": {}}), "'conformance' is not a list"),
    ],
)
def test_a_file_that_cannot_be_read_is_named_with_the_problem(
    text: str, problem: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    record = tmp_path / "conformance.json"
    record.write_text(text)
    with pytest.raises(ConfigError, match="--record-conformance") as raised:
        load_results(record)
    assert problem in str(raised.value) and str(record) in str(raised.value)
    assert main(["--declared", "--results", str(record)]) == 2
    assert problem in capsys.readouterr().err


def test_the_committed_results_are_readable_and_name_known_backends() -> None:
    results = load_results(ROOT / "docs/results/conformance.json")
    assert results.conformance, "no results recorded"
    assert {entry.backend for entry in (*results.conformance, *results.attacks)} <= {
        "local", "docker", "e2b", "daytona", "modal"
    }  # fmt: skip
