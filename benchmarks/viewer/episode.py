"""One episode's page: its result, instruction, steps, verifier, end-state diff and network audit.

Everything here comes from the episode's files (``benchmarks.episodes.recording.episodefiles``),
found through the ledger record's ``files``; most of it was written by the
agent under evaluation (actions, outputs, model messages, file names,
hosts), so it goes to the browser as JSON strings and the page shows them as
text. Lists an agent can make long (diff paths, connections) are capped.
"""

from __future__ import annotations

from typing import Any

from benchmarks.episodes.recording import episodefiles
from benchmarks.viewer.access import RunFiles

DIFF_FILE = "diff.json"
MAX_VERIFIER_OUTPUT_BYTES = 1024 * 1024
MAX_LISTED = 2000
"""The most paths per kind of change, and connections, sent to the page (the raw files have all)."""
RESULT_FIELDS = (
    "episode_id", "task_id", "sample", "attempt", "outcome", "reward", "passed", "end_reason", "error", "steps",
    "episode_s", "agent_s", "env_s", "reset_latency_ms", "reset_kind", "verification", "backend", "provider",
    "sandbox_id", "agent", "env_id", "start_digest", "task_snapshot_digest", "infra_failures",
)  # fmt: skip
TOKEN_KEYS = ("prompt_tokens", "completion_tokens", "total_prompt_tokens", "total_completion_tokens")


def describe(files: RunFiles, record: dict[str, Any]) -> dict[str, Any]:
    """The episode page's data for a standing result ``record``."""
    named = record.get("files") or {}
    folder = episode_folder(record)
    trajectory = files.read_json(named.get("trajectory") or f"{folder}/{episodefiles.TRAJECTORY_FILE}")
    trajectory = trajectory if isinstance(trajectory, dict) else None
    output_path = named.get("verifier_output") or f"{folder}/{episodefiles.VERIFIER_OUTPUT_FILE}"
    verdict = files.read_json(named.get("verifier") or f"{folder}/{episodefiles.VERIFIER_RESULT_FILE}")
    diff = files.read_json(named.get("diff") or f"{folder}/{DIFF_FILE}")
    connections = files.read_json(named.get("network") or f"{folder}/{episodefiles.NETWORK_FILE}")
    steps = None if trajectory is None else _trajectory(trajectory)
    return {
        "result": {key: record.get(key) for key in RESULT_FIELDS},
        "tokens": token_count(record) if steps is None or steps["tokens"] is None else steps["tokens"],
        "trajectory": steps,
        "verifier": {
            "output": files.read_text(output_path, max_bytes=MAX_VERIFIER_OUTPUT_BYTES),
            "verdict": verdict if isinstance(verdict, dict) else None,
        },
        "diff": _diff(diff) if isinstance(diff, dict) else None,
        "network": _network(record.get("network"), connections),
        "files": files.listing(folder),
    }


def episode_folder(record: dict[str, Any]) -> str:
    """The episode's folder relative to the run directory (the ledger names it; older ledgers did not)."""
    named = record.get("files") or {}
    if named.get("dir"):
        return str(named["dir"])
    task, sample, attempt = str(record.get("task_id")), int(record.get("sample") or 0), int(record.get("attempt") or 1)
    return episodefiles.episode_dir(task, sample, attempt)


def token_count(counts: dict[str, Any]) -> int | None:
    """Prompt plus completion tokens in ``counts`` (a result record or ATIF metrics); None: not counted."""
    found = [counts[key] for key in TOKEN_KEYS if isinstance(counts.get(key), int | float)]
    return int(sum(found)) if found else None


def _trajectory(atif: dict[str, Any]) -> dict[str, Any]:
    """The instruction, then one entry per agent step: action, output, model turn, exit code."""
    steps = [step for step in atif.get("steps") or [] if isinstance(step, dict)]
    users = [step for step in steps if step.get("source") == "user"]
    extra = _mapping(atif.get("extra"))
    final = _mapping(atif.get("final_metrics"))
    return {
        "instruction": _text(users[0].get("message")) if users else None,
        "steps": [_step(step) for step in steps if step is not (users[0] if users else None)],
        "total_steps": final.get("total_steps"),
        "tokens": token_count(final),
        "truncated": extra.get("truncated") or None,
        "agent": _mapping(atif.get("agent")) or None,
    }


def _step(step: dict[str, Any]) -> dict[str, Any]:
    observation = _mapping(step.get("observation"))
    outputs = {
        str(item.get("source_call_id")): _text(item.get("content"))
        for item in observation.get("results") or []
        if isinstance(item, dict)
    }
    calls = [call for call in step.get("tool_calls") or [] if isinstance(call, dict)]
    extra = _mapping(step.get("extra"))
    metrics = _mapping(step.get("metrics"))
    return {
        "step_id": step.get("step_id"),
        "source": _text(step.get("source")),
        "message": _text(step.get("message")),
        "model_name": _text(step.get("model_name")) or None,
        "tokens": {k: v for k, v in metrics.items() if isinstance(v, int | float)} or None,
        "calls": [_call(call, outputs) for call in calls],
        "outputs": [] if calls else list(outputs.values()),
        "exit_code": extra.get("exit_code"),
        "duration_s": extra.get("exec_duration_s"),
        "timed_out": bool(extra.get("timed_out")),
    }


def _call(call: dict[str, Any], outputs: dict[str, str]) -> dict[str, Any]:
    arguments = _mapping(call.get("arguments"))
    command = arguments.get("command")
    name = _text(call.get("function_name"))
    action = _text(command) if command is not None else (name if not arguments else _text(arguments))
    return {"tool": name, "action": action, "output": outputs.get(str(call.get("tool_call_id")))}


def _diff(diff: dict[str, Any]) -> dict[str, Any]:
    if "unavailable" in diff:
        return {"unavailable": _text(diff["unavailable"])}
    shown: dict[str, Any] = {"source": _text(diff.get("source")), "truncated": bool(diff.get("truncated"))}
    counts = _mapping(diff.get("counts"))
    for kind in ("added", "changed", "removed"):
        listed = diff.get(kind)
        paths = [_text(path) for path in listed] if isinstance(listed, list) else []
        shown[kind] = paths[:MAX_LISTED]
        total = counts.get(kind)
        shown[f"{kind}_count"] = total if isinstance(total, int) else len(paths)
    return shown


def _network(audit: Any, detail: Any) -> dict[str, Any] | None:
    """The ledger's audit summary, and the connections network.json lists (first :data:`MAX_LISTED`)."""
    if not isinstance(audit, dict) and not isinstance(detail, dict):
        return None
    connections = detail.get("connections") if isinstance(detail, dict) else None
    connections = [c for c in connections or [] if isinstance(c, dict)]
    return {
        "summary": audit if isinstance(audit, dict) else (detail or {}).get("summary"),
        "connections": connections[:MAX_LISTED],
        "connections_total": len(connections),
    }


def _mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _text(value: Any) -> str:
    if value is None:
        return ""
    return value if isinstance(value, str) else str(value)
