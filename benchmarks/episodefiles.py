"""Per-episode files of a run: ``<run>/episodes/<task>/<sample>-<attempt>/``.

Written only when an episode has something to keep (today: its network audit,
``network.json``, when the sandbox tried to reach anything). The ledger record
names the folder, relative to the run directory.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

EPISODES_DIR = "episodes"
NETWORK_FILE = "network.json"
MAX_CONNECTIONS_KEPT = 2000
"""The most connection records written per episode (the summary counts them all)."""
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def episode_dir(task_id: str, sample: int, attempt: int) -> str:
    """The folder of one attempt of one episode, relative to the run directory."""
    return f"{EPISODES_DIR}/{_UNSAFE.sub('_', task_id)}/{sample}-{attempt}"


def write_network(run_dir: Path, folder: str, network: dict[str, Any]) -> str:
    """Write an episode's network audit; returns its path relative to the run directory."""
    connections = list(network.get("connections", []))
    kept = {**network, "connections": connections[:MAX_CONNECTIONS_KEPT]}
    if len(connections) > MAX_CONNECTIONS_KEPT:
        kept["connections_not_written"] = len(connections) - MAX_CONNECTIONS_KEPT
    target = run_dir / folder / NETWORK_FILE
    target.parent.mkdir(parents=True, exist_ok=True)
    staged = target.with_name(f".{NETWORK_FILE}.tmp")
    staged.write_text(json.dumps(kept, indent=1, default=str) + "\n")
    os.replace(staged, target)
    return f"{folder}/{NETWORK_FILE}"


def network_record(network: dict[str, Any] | None) -> dict[str, Any] | None:
    """What the ledger keeps of an episode's audit: the policy and the summary, not each connection."""
    if not network:
        return None
    summary = dict(network.get("summary") or {})
    return {"policy": network.get("policy"), **summary, "dropped": network.get("dropped", 0)}
