"""A whole Harbor-format suite in one command, as a user's folder is: dozens of tasks that build,
tasks whose image cannot be had, tasks whose build fails, tasks whose verifier needs a network
its policy refuses, tasks this host cannot build, and a task.toml that does not parse.
``python -m benchmarks.run suite=dir suite.path=DIR agent=oracle``: every task either scores its
reference solution's 1.0, or is skipped or left unscored with a reason that names what is missing;
no task is a silent 0."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BUILTIN = REPO / "envs" / "builtin"

DOWNLOADING_TEST = """#!/bin/bash
mkdir -p /logs/verifier
if curl -fsS --max-time 10 https://downloads.example.com/checker.sh -o /tmp/checker.sh; then echo 1; else echo 0; fi \\
  > /logs/verifier/reward.txt
"""


def make_suite(root: Path) -> dict[str, str]:
    """The suite, and what each kind of task must end as."""
    expected: dict[str, str] = {}
    for task in sorted(p for p in BUILTIN.iterdir() if (p / "task.toml").is_file()):
        shutil.copytree(task, root / task.name)
        expected[task.name] = "scored"
    for n in range(3):  # an image no registry serves
        task = root / f"missing-image-{n}"
        shutil.copytree(BUILTIN / "log-error-count", task)
        (task / "environment" / "Dockerfile").write_text(f"FROM 127.0.0.1:9/snapgym/no-such-image:{n}\nWORKDIR /app\n")
        expected[task.name] = "no-such-image"
    for n in range(2):  # a build step that fails
        task = root / f"failing-build-{n}"
        shutil.copytree(BUILTIN / "log-error-count", task)
        dockerfile = task / "environment" / "Dockerfile"
        dockerfile.write_text(dockerfile.read_text() + f"RUN echo the vendor tarball {n} is gone >&2 && exit 3\n")
        expected[task.name] = f"the vendor tarball {n} is gone"
    for n in range(2):  # a verifier that downloads, under a policy that refuses it
        task = root / f"offline-verifier-{n}"
        shutil.copytree(BUILTIN / "log-error-count", task)
        toml = task / "task.toml"
        toml.write_text(toml.read_text().replace("[verifier]\n", '[verifier]\nnetwork_mode = "no-network"\n'))
        (task / "tests" / "test.sh").write_text(DOWNLOADING_TEST)
        expected[task.name] = "downloads.example.com"
    for n in range(2):  # a package this host does not have (the host base checks apt-get installs)
        task = root / f"needs-package-{n}"
        shutil.copytree(BUILTIN / "log-error-count", task)
        dockerfile = task / "environment" / "Dockerfile"
        dockerfile.write_text(dockerfile.read_text() + f"RUN apt-get install -y snapgym-no-such-package-{n}\n")
        expected[task.name] = f"snapgym-no-such-package-{n}"
    bad = root / "bad-toml"
    shutil.copytree(BUILTIN / "log-error-count", bad)
    (bad / "task.toml").write_text("this is [not toml\n")
    expected["bad-toml"] = "not valid TOML"
    return expected


def test_every_task_of_a_mixed_suite_ends_right_or_says_why(tmp_path: Path) -> None:
    suite = tmp_path / "suite"
    suite.mkdir()
    expected = make_suite(suite)
    assert len(expected) >= 30
    out = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.run", "suite=dir", f"suite.path={suite}", "agent=oracle",
         "progress=false", "benchmark.plots=false", f"backend.store_dir={tmp_path / 'store'}",
         f"output_dir={out}", f"hydra.run.dir={tmp_path / 'hydra'}"],
        cwd=REPO, capture_output=True, text=True, timeout=1800,
    )  # fmt: skip
    summary = json.loads((out / "summary.json").read_text())
    results = [json.loads(line) for line in (out / "ledger.jsonl").read_text().splitlines()]
    results = [r for r in results if r["kind"] == "result"]
    said = {task: reason for task, reason in summary.get("skipped_tasks", {}).items()}
    for record in results:
        if record["outcome"] != "scored":
            said[record["task_id"]] = f"{record['outcome']}: {record.get('error')} {json.dumps(record.get('extra'))}"
    for task, outcome in expected.items():
        if outcome == "scored":
            assert summary["by_task"][task]["mean_reward"] == 1.0, (task, said.get(task))
        else:
            assert task in said and outcome in said[task], (task, said.get(task))
    scored_zero = [r["task_id"] for r in results if r["outcome"] == "scored" and r["reward"] == 0.0]
    assert scored_zero == [], "a silent 0"
    assert done.returncode in (0, 4), done.stderr[-3000:]
