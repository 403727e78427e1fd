"""Per-episode files of a run: ``<run>/episodes/<task>/<sample>-<attempt>/``, laid out as Harbor's trials are.

- ``result.json``: the episode's result record (the ledger's line, as JSON).
- ``agent/trajectory.json``: what the agent did and saw, in ATIF (:mod:`envs.spaces.trajectory`).
- ``verifier/test-stdout.txt``: the verifier's output (test.sh's stdout and stderr, capped by the
  environment), ``verifier/result.json``: its verdict without the output (reward, exit code,
  timing, removed links, missing outputs, notes), and the test reports test.sh left beside the
  reward (``verifier/ctrf.json``, as Terminal-Bench 2's ``pytest --ctrf`` writes it).
- ``agent/tokens.jsonl``: every model call's prompt and completion token ids, log-probabilities and
  model version, one JSON line per call, when they were captured (``agent.capture_tokens`` with
  ``agent=llm``, a model route's ``capture_tokens``; :mod:`envs.spaces.tokens`).
- ``agent/logs/``: an installed agent's own logs and trajectory, as it wrote them in the sandbox.
- ``network.json``: the connection attempts, when the sandbox tried to reach anything, and an
  installed agent's model calls with their token usage (their token ids are in ``agent/tokens.jsonl``).
- ``<sample>-journal.jsonl`` beside the attempts' folders: the episode's journal, with
  ``checkpoint_every`` set (:mod:`benchmarks.episodes.recording.journal`).
- ``diff.json``: what the agent left changed against the episode's start (paths added, changed,
  removed: ``pool.changes``), when the backend can list it without asking the sandbox.

The ledger record names each file (``files``), relative to the run directory; the
ledger, not these files, is the run's durable record (they are written without fsync,
each whole or not at all).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from envs.spaces.tokens import TOKENS_FILE

EPISODES_DIR = "episodes"
DIFF_FILE = "diff.json"
NETWORK_FILE = "network.json"
RESULT_FILE = "result.json"
TRAJECTORY_FILE = "agent/trajectory.json"
AGENT_LOGS_DIR = "agent/logs"
VERIFIER_OUTPUT_FILE = "verifier/test-stdout.txt"
VERIFIER_RESULT_FILE = "verifier/result.json"
MAX_CONNECTIONS_KEPT = 2000
"""The most connection records written per episode (the summary counts them all)."""
_STAGE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def journal_file(task_id: str, sample: int) -> str:
    """The journal of one episode (all its attempts; see benchmarks.episodes.recording.journal), relative to the
    run directory."""
    return f"{EPISODES_DIR}/{_UNSAFE.sub('_', task_id)}/{sample}-journal.jsonl"


def episode_dir(task_id: str, sample: int, attempt: int) -> str:
    """The folder of one attempt of one episode, relative to the run directory."""
    return f"{EPISODES_DIR}/{_UNSAFE.sub('_', task_id)}/{sample}-{attempt}"


def write_network(run_dir: Path, folder: str, network: dict[str, Any]) -> str:
    """Write an episode's network audit; returns its path relative to the run directory."""
    connections = list(network.get("connections", []))
    kept = {**network, "connections": connections[:MAX_CONNECTIONS_KEPT]}
    if network.get("model_calls"):  # their tokens go in agent/tokens.jsonl
        kept["model_calls"] = [{k: v for k, v in call.items() if k != "tokens"} for call in network["model_calls"]]
    if len(connections) > MAX_CONNECTIONS_KEPT:
        kept["connections_not_written"] = len(connections) - MAX_CONNECTIONS_KEPT
    return write_json(run_dir, f"{folder}/{NETWORK_FILE}", kept)


def write_tokens(run_dir: Path, folder: str, lines: list[dict[str, Any]]) -> str:
    """Write an episode's token lines (:func:`envs.spaces.tokens.token_lines`); returns the path relative to the
    run directory."""
    text = "".join(json.dumps(line, separators=(",", ":")) + "\n" for line in lines)
    return write_text(run_dir, f"{folder}/{TOKENS_FILE}", text)


def write_changes(run_dir: Path, folder: str, changes: dict[str, Any]) -> str:
    """Write an episode's end-state diff; returns its path relative to the run directory."""
    return write_json(run_dir, f"{folder}/{DIFF_FILE}", changes)


def write_trajectory(run_dir: Path, folder: str, trajectory: dict[str, Any]) -> str:
    """Write an episode's ATIF trajectory; returns its path relative to the run directory."""
    return write_json(run_dir, f"{folder}/{TRAJECTORY_FILE}", trajectory)


def write_verifier(run_dir: Path, folder: str, verdict: dict[str, Any]) -> dict[str, str]:
    """Write the verifier's output, verdict and test reports; returns their paths by kind."""
    output = str(verdict.get("output") or "")
    reports = dict(verdict.get("reports") or {})
    rest = {key: value for key, value in verdict.items() if key not in ("output", "reports")}
    written = {
        "verifier_output": write_text(run_dir, f"{folder}/{VERIFIER_OUTPUT_FILE}", output),
        "verifier": write_json(run_dir, f"{folder}/{VERIFIER_RESULT_FILE}", rest),
    }
    for name, text in sorted(reports.items()):  # names from envs.tasks.verifier.REPORT_FILES, never the sandbox's
        written[f"verifier_{name}"] = write_text(run_dir, f"{folder}/verifier/{name}", str(text))
    return written


def write_agent_files(run_dir: Path, folder: str, files: dict[str, bytes]) -> dict[str, str]:
    """Write an installed agent's own logs under ``agent/logs/``; returns their paths by name.

    The agent chose the names: each part of a path is made safe (no ``..``, no separators, no odd
    characters), so nothing lands outside the episode's folder."""
    written: dict[str, str] = {}
    for name, data in sorted(files.items()):
        parts = [_UNSAFE.sub("_", part) for part in name.split("/") if part]
        parts = [part if part.strip(".") else part.replace(".", "_") for part in parts] or ["_"]
        relative = f"{folder}/{AGENT_LOGS_DIR}/{'/'.join(parts)}"
        try:
            written[f"agent_log:{name}"] = write_bytes(run_dir, relative, data)
        except (NotADirectoryError, IsADirectoryError):  # a file where a folder of another name is, or so
            flat = f"{folder}/{AGENT_LOGS_DIR}/{'__'.join(parts)}.{len(written)}"
            written[f"agent_log:{name}"] = write_bytes(run_dir, flat, data)
    return written


def write_json(run_dir: Path, relative: str, document: Any) -> str:
    """Write ``document`` as JSON at ``run_dir / relative``, whole or not at all; returns ``relative``."""
    # compact: json's C encoder (an indent would run its pure-Python one, several times slower)
    return write_text(run_dir, relative, json.dumps(document, default=str, separators=(",", ":")) + "\n")


def write_text(run_dir: Path, relative: str, text: str) -> str:
    """Write ``text`` at ``run_dir / relative``, whole or not at all; returns ``relative``."""
    return write_bytes(run_dir, relative, text.encode("utf-8", errors="replace"))


def write_bytes(run_dir: Path, relative: str, data: bytes) -> str:
    """Write ``data`` at ``run_dir / relative``, whole or not at all; returns ``relative``."""
    target = os.path.join(run_dir, relative)
    folder, name = os.path.split(target)
    staged = os.path.join(folder, f".{name}.tmp")
    try:  # the folder exists for all of an episode's files but its first: no mkdir for them
        fd = os.open(staged, _STAGE_FLAGS, 0o666)
    except FileNotFoundError:
        os.makedirs(folder, exist_ok=True)
        fd = os.open(staged, _STAGE_FLAGS, 0o666)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)
    os.replace(staged, target)
    return relative


def network_record(network: dict[str, Any] | None) -> dict[str, Any] | None:
    """What the ledger keeps of an episode's audit: the policy and the summary, not each connection."""
    if not network:
        return None
    summary = dict(network.get("summary") or {})
    record = {"policy": network.get("policy"), **summary, "dropped": network.get("dropped", 0)}
    if network.get("model_summary"):
        record["model"] = network["model_summary"]
    return record


def changes_record(changes: dict[str, Any] | None) -> dict[str, Any] | None:
    """What the ledger keeps of an episode's end-state diff: the counts, not the paths (``diff.json`` has them)."""
    if not changes:
        return None
    if "unavailable" in changes:
        return {"unavailable": changes["unavailable"]}
    return {**dict(changes.get("counts") or {}), "truncated": bool(changes.get("truncated"))}
