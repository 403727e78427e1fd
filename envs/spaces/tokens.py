"""An episode's model calls with their tokens: in its ATIF trajectory, and as ``tokens.jsonl`` for a trainer.

Each model call whose tokens were captured (:mod:`pool.egress.models.tokens`) is written twice:

- in the ATIF trajectory, with ATIF's own fields: a model agent's call (``agent=llm``) in its step's
  ``metrics`` (``prompt_token_ids``, ``completion_token_ids``, ``logprobs``; the reply's model and
  version, and why tokens are missing, in ``metrics.extra``); the calls an agent inside the sandbox
  made through the model gateway, which are not steps of the trajectory, in ``extra.model_calls`` of
  the step they were made during, each ``{"call", "route", "path", "model_name", "metrics"}``;
- in ``tokens.jsonl`` beside it, one JSON line per call in the order they were made (:func:`token_lines`).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pool.egress.models.tokens import atif_metrics

TOKENS_FILE = "agent/tokens.jsonl"
"""Where an episode's token lines go, relative to its folder."""
_TOKEN_FIELDS = ("prompt_token_ids", "completion_token_ids", "logprobs")


def attach_model_calls(steps: list[dict[str, Any]], ended: Sequence[float], calls: Iterable[Mapping[str, Any]]) -> None:
    """Put the gateway's calls that carry a token record into ``extra.model_calls`` of the agent step
    they were made during (the first step that ended after the call began; the last, failing that).

    ``steps``: the ATIF agent steps (changed in place); ``ended``: when each ended (Unix time);
    ``calls``: the network audit's model calls (``pool.network.audit.ModelCall.as_dict``)."""
    if not steps:
        return
    for call in calls:
        record = call.get("tokens")
        if not isinstance(record, Mapping):
            continue
        at = min(bisect.bisect_left(list(ended[: len(steps)]), float(call.get("time") or 0.0)), len(steps) - 1)
        entry = {
            "route": call.get("route"), "path": call.get("path"), "model_name": call.get("model"),
            "metrics": {**_counts(call), **atif_metrics(record)},
        }  # fmt: skip
        steps[at].setdefault("extra", {}).setdefault("model_calls", []).append(entry)


def token_lines(atif: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The episode's ``tokens.jsonl``: for every model call with a token record, in order, ``{"call": N,
    "step": ATIF step_id, "source": "agent" | "gateway", "route", "path", "model", "model_version",
    "prompt_token_ids", "completion_token_ids", "logprobs", "why"}`` (a list is null where the server sent
    none, and ``why`` says why)."""
    lines: list[dict[str, Any]] = []
    for step in atif.get("steps") or []:
        metrics = step.get("metrics") or {}
        if _has_record(metrics):
            lines.append(_line(step, "agent", None, None, metrics))
        for call in (step.get("extra") or {}).get("model_calls") or []:
            lines.append(_line(step, "gateway", call.get("route"), call.get("path"), call.get("metrics") or {}))
    return [{"call": index, **line} for index, line in enumerate(lines)]


def _has_record(metrics: Mapping[str, Any]) -> bool:
    extra = metrics.get("extra") or {}
    return any(name in metrics for name in _TOKEN_FIELDS) or "tokens_missing" in extra


def _line(step: Mapping[str, Any], source: str, route: Any, path: Any, metrics: Mapping[str, Any]) -> dict[str, Any]:
    extra = metrics.get("extra") or {}
    return {
        "step": step.get("step_id"), "source": source, "route": route, "path": path,
        "model": extra.get("response_model"), "model_version": extra.get("model_version"),
        **{name: metrics.get(name) for name in _TOKEN_FIELDS}, "why": extra.get("tokens_missing"),
    }  # fmt: skip


def _counts(call: Mapping[str, Any]) -> dict[str, int]:
    counts = {"prompt_tokens": call.get("input_tokens"), "completion_tokens": call.get("output_tokens")}
    return {name: int(value) for name, value in counts.items() if isinstance(value, int)}
