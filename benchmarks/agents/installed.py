"""Installed agents: a CLI agent (Claude Code, Codex CLI, any other) that runs inside the sandbox.

This is how Terminal-Bench 2 scores agents today (Harbor's "installed
agents"). The agent is installed into the task's snapshot at build time, as
its vendor documents (``npm install -g ...``), by setup commands appended to
the task's template: they run under the task's build network policy, and
the snapshot (named by a hash of its template) holds the install, so every
episode starts from the same installed agent without reinstalling it.

An episode is one action: the agent's command line, run in the task's
working directory with the task's agent timeout (``[agent] timeout_sec``),
the instruction in a file under :data:`LOGS_DIR`. The agent writes its own
logs and trajectory there; after the command ends they are copied out into
the episode's folder (``agent/<file>``), capped. Then the agent submits and
the verifier scores the end state, as for any agent.

The agent's model calls go to the sandbox's model gateway (:mod:`pool.egress.models.routes`):
inside the sandbox it sees ``ANTHROPIC_BASE_URL`` / ``OPENAI_BASE_URL`` at
``127.0.0.1`` and a placeholder key; the real key stays in the runner's
environment and is added by the egress proxy outside the sandbox. The route
the agent needs is in its config (``model_route``); the runner adds it to the
backend's egress settings. The trade-off against an agent outside the sandbox
(``agent=llm``) is in the README ("Agents inside the sandbox, keys outside").
"""

from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from benchmarks.agents.base import AgentError, EpisodeContext, Observation
from envs.spaces.actions import SUBMIT
from envs.tasks import Task
from envs.wrappers import sandbox_env
from pool.egress.models.routes import parse_routes
from pool.errors import ConfigError, SnapgymError

LOGS_DIR = "/logs/agent"
"""Where the agent's instruction goes and where it writes its logs (Harbor's place for them)."""
INSTRUCTION_FILE = f"{LOGS_DIR}/instruction.md"
MAX_LOG_FILES = 64
"""The most files copied out of :data:`LOGS_DIR` per episode."""
_PLACEHOLDERS = ("{model}", "{instruction_file}", "{logs_dir}", "{version}")


class InstalledAgent:
    """A CLI agent installed into every task's snapshot and run inside the sandbox.

    Args:
        kind: what the agent is (``claude-code``, ``codex``, or your own name); recorded with the version.
        version: the version installed, pinned (``{version}`` in ``install`` is replaced by it).
        install: shell commands that install the agent at build time, in order.
        command: the command line that runs the agent on the task; ``{instruction_file}``, ``{model}``,
            ``{logs_dir}`` and ``{version}`` are replaced (the file's path is shell-quoted).
        model: the model the agent is told to use ('' when the command names none).
        env: variables for the agent's command (on top of the model route's base URL and placeholder key).
        model_route: the model route (fields of ``pool.egress.models.routes.ModelRoute``) the runner adds to the
            backend's egress settings, unless the backend configures a route of that name itself.
        max_log_bytes: the most bytes copied out of :data:`LOGS_DIR` per episode.

    Raises:
        ConfigError: no version, no install commands, or a command without the instruction.
    """

    def __init__(
        self,
        *,
        kind: str = "installed",
        version: str,
        install: Sequence[str],
        command: str,
        model: str = "",
        env: Mapping[str, str] | None = None,
        model_route: Mapping[str, Any] | None = None,
        max_log_bytes: int = 16 << 20,
    ) -> None:
        if not str(version).strip():
            raise ConfigError(f"agent {kind}: pin a version (agent.version); an unpinned agent is not reproducible")
        if isinstance(install, str) or not install:
            raise ConfigError(f"agent {kind}: agent.install must be a list of shell commands that install it")
        if "{instruction_file}" not in command:
            raise ConfigError(f"agent {kind}: agent.command must pass the task's instruction: use {{instruction_file}}")
        self.kind, self.version, self.model = kind, str(version), model
        self.name = f"{kind}@{self.version}" + (f":{model}" if model else "")
        self.whole_task_steps = True
        self.install = tuple(str(step).replace("{version}", self.version) for step in install)
        self.command = command
        self.env = {str(k): str(v) for k, v in dict(env or {}).items()}
        self.model_route = dict(model_route) if model_route else None
        self.max_log_bytes = max_log_bytes

    def with_install(self, task: Task) -> Task:
        """``task`` whose snapshot also holds this agent, installed after the task's own setup."""
        setup = (*task.template.setup, *self.install, f"mkdir -p {LOGS_DIR}")
        return dataclasses.replace(task, template=dataclasses.replace(task.template, setup=setup))

    def check_model_key(self) -> None:
        """Fail now, before any sandbox starts, when the model route's key is not in this process.

        Raises:
            ConfigError: the route is invalid, or its ``credential_env`` is not set.
        """
        if self.model_route is not None:
            parse_routes([self.model_route])[0].credential_headers()

    def start(self, episode: EpisodeContext) -> InstalledPolicy:
        """A policy that runs the agent once, copies its logs out, and submits.

        Raises:
            AgentError: the environment is not a shell (an installed agent runs as a command).
        """
        if not episode.env_id.endswith("Shell-v0"):
            raise AgentError(f"an installed agent runs in a shell; use env=shell, not {episode.env_id}")
        return InstalledPolicy(self, episode)

    def action(self) -> str:
        """The command line of one episode."""
        command = self.command
        for placeholder, value in zip(
            _PLACEHOLDERS, (self.model, shlex.quote(INSTRUCTION_FILE), LOGS_DIR, self.version), strict=True
        ):
            command = command.replace(placeholder, value)
        if not self.env:
            return command
        exports = " ".join(f"{name}={shlex.quote(value)}" for name, value in self.env.items())
        return f"(export {exports}; {command})"


class InstalledPolicy:
    """One episode of an installed agent."""

    def __init__(self, agent: InstalledAgent, episode: EpisodeContext) -> None:
        self._agent = agent
        self._episode = episode
        self._ran = False
        self.files: dict[str, bytes] = {}
        """The agent's own files from :data:`LOGS_DIR` (relative path -> content), once it has run."""

    def act(self, observation: Observation, info: dict[str, Any]) -> str:
        sandbox = sandbox_env(self._episode.env).sandbox
        assert sandbox is not None
        if not self._ran:
            self._ran = True
            sandbox.write_file(INSTRUCTION_FILE, self._episode.task.instruction.encode(), mode=0o644)
            return self._agent.action()
        self.files = collect_logs(sandbox, max_bytes=self._agent.max_log_bytes)
        return SUBMIT


def collect_logs(sandbox: Any, *, max_bytes: int) -> dict[str, bytes]:
    """The regular files under :data:`LOGS_DIR` (not the instruction), at most :data:`MAX_LOG_FILES` and
    ``max_bytes`` in all (a file past the cap is replaced by a note saying so). The agent wrote them: they
    are read as data through the sandbox's file API, and links are not followed."""
    listing = sandbox.exec(
        f"find {LOGS_DIR} -type f -printf '%s %P\\0' 2>/dev/null | head -z -n {MAX_LOG_FILES + 1}", timeout_s=30
    )
    files: dict[str, bytes] = {}
    left = max_bytes
    for entry in listing.stdout.split("\0"):
        size, _, relative = entry.partition(" ")
        if not relative or relative == "instruction.md" or not size.isdigit() or ".." in relative.split("/"):
            continue
        if len(files) >= MAX_LOG_FILES or left <= 0:
            break
        if int(size) > left:
            files[relative] = f"[snapgym: not copied: {size} bytes, over the episode's max_log_bytes]\n".encode()
            continue
        try:
            data = sandbox.read_file(f"{LOGS_DIR}/{relative}", max_bytes=left, follow_symlinks=False)
        except SnapgymError as exc:  # it changed since the listing, or it is a link now
            data = f"[snapgym: not copied: {exc}]\n".encode()
        files[relative] = data
        left -= len(data)
    return files
