"""Config schemas of the runner's groups (pool, suite, agent) and of the run itself.

Like ``benchmarks.config``, each is a plain dataclass registered with
Hydra's ConfigStore; choices are Enums, so a wrong value fails while Hydra
composes and the message lists the valid ones.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from omegaconf import MISSING

from benchmarks.agents.chat import DEFAULT_MAX_RETRIES, DEFAULT_TIMEOUT_S
from benchmarks.episodes.settings import EpisodeSettings
from pool.cluster.config import PoolConfig


class PoolKind(enum.Enum):
    """Where the episodes' sandboxes come from."""

    direct = "direct"
    """A backend in this process; each running episode holds one sandbox and restores it in place."""
    ray = "ray"
    """A Ray-managed SandboxPool (this machine, or the Ray cluster the job runs on)."""


class EnvKind(enum.Enum):
    """What an action is."""

    shell = "snapgym/Shell-v0"
    python = "snapgym/Python-v0"


class VerificationChoice(enum.Enum):
    """How every episode's verifier is kept apart from its agent (see ``envs.tasks.verifier``)."""

    task = "task"
    """What each task declares (``[snapgym] verification``); strict when it declares nothing."""
    strict = "strict"
    """The verifier runs in a fresh sandbox that shows only the task's outputs of the agent's end state."""
    toolchain = "toolchain"
    """As strict, plus what the agent added where packages install, filtered (``pool.verification.installs``)."""
    shared = "shared"
    """The verifier runs beside the agent's live processes, as in Harbor (private reward channel and tests)."""


_POOL = PoolConfig()
"""The pool's own defaults: the ray settings below take theirs from here (``configs/pool/ray.yaml``
sets the runner's own choices, each with its reason)."""


@dataclass
class PoolSettings:
    """How many episodes run at once, and the Ray pool's sizing and limits (``pool.cluster.config.PoolConfig``)."""

    kind: PoolKind = PoolKind.direct
    """``direct`` or ``ray``."""
    size: int = 4
    """Episodes run at once (threads of the runner, one sandbox each)."""
    min_warm: int = _POOL.min_warm
    """ray: ready sandboxes kept per task snapshot even when idle."""
    max_warm: int = _POOL.max_warm
    """ray: the most ready sandboxes kept per task snapshot."""
    max_size: int = _POOL.max_size
    """ray: the most sandboxes in the pool."""
    lease_ttl_s: float = _POOL.lease_ttl_s
    """ray: a lease not renewed for this long is reclaimed."""
    acquire_timeout_s: float = _POOL.acquire_timeout_s
    """ray: how long a reset waits for a ready sandbox."""
    max_failures: int = _POOL.max_failures
    """ray: failed sandboxes of one snapshot within ``failure_window_s`` that stop its recreation."""
    failure_window_s: float = _POOL.failure_window_s
    """ray: the window of ``max_failures``."""


@dataclass
class SuiteConfig:
    """Which tasks to run."""

    name: str = "builtin"
    """A label for reports."""
    path: str | None = None
    """A folder of Harbor-format task directories; None: the built-in suite."""
    include: list[str] = field(default_factory=list)
    """Task ids or glob patterns to keep (empty: all)."""
    exclude: list[str] = field(default_factory=list)
    """Task ids or glob patterns to drop."""
    limit: int | None = None
    """Keep only the first N tasks (sorted by id) after filtering."""
    images: list[str] = field(default_factory=list)
    """``IMAGE=SOURCE`` entries: get IMAGE (with or without tag) from SOURCE instead: ``host``, a root
    filesystem path, ``docker-archive:/saved.tar``, ``oci:/layout:tag``, or a mirror's reference."""
    strict: bool = False
    """true: an invalid task (a broken ``task.toml``, a refused Dockerfile) stops the run; false: the run
    skips it, lists it on stderr at the start and under ``skipped_tasks`` in summary.json."""


@dataclass
class DirSuiteConfig(SuiteConfig):
    """Tasks from a folder of Harbor-format task directories (``suite=dir suite.path=...``): the suite's
    settings, with the folder required."""

    name: str = "dir"
    """A label for reports."""
    path: str = MISSING
    """The folder (required)."""


@dataclass
class OracleAgentConfig:
    """Runs each task's reference solution."""

    name: str = "oracle"


@dataclass
class NoopAgentConfig:
    """Submits the start state (after ``steps`` runs of ``true``)."""

    name: str = "noop"
    steps: int = 0
    """Runs of ``true`` before submitting."""


@dataclass
class ReplayAgentConfig:
    """Actions from a JSONL file or a list."""

    name: str = "replay"
    path: str | None = None
    """A JSONL file of ``{"action": ...}`` lines or a RecordTrajectory recording."""
    actions: list[str] = field(default_factory=list)
    """Actions for every task, when ``path`` is null."""


@dataclass
class PythonAgentConfig:
    """Your own agent class, imported in the runner's process (benchmarks.agents.imported, docs/agents.md)."""

    name: str = "python"
    target: str = MISSING
    """``module:Class`` (importable from the directory the run starts in) or ``path/to/file.py:Class``."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments of the class's constructor (``agent.kwargs.steps=3`` or ``'agent.kwargs={steps: 3}'``)."""


@dataclass
class InstalledAgentConfig:
    """A CLI agent installed into each task's snapshot and run inside the sandbox (benchmarks.agents.installed)."""

    name: str = "installed"
    kind: str = "installed"
    """What the agent is (``claude-code``, ``codex``, your own); recorded with the version in every result."""
    version: str = MISSING
    """The version installed, pinned; ``{version}`` in ``install`` is replaced by it."""
    install: list[str] = field(default_factory=list)
    """Shell commands that install the agent at build time (under the task's build network policy)."""
    command: str = MISSING
    """The command line of an episode; ``{instruction_file}``, ``{model}``, ``{logs_dir}``, ``{version}``."""
    model: str = ""
    """The model the command names."""
    env: dict[str, str] = field(default_factory=dict)
    """Variables for the agent's command."""
    model_route: dict[str, Any] | None = None
    """The model route (``pool.egress.models.routes.ModelRoute`` fields) the runner adds to the backend's egress
    settings, unless the backend has a route of that name; the key's variable is read outside the sandbox."""
    max_log_bytes: int = 16 << 20
    """The most bytes of the agent's own logs copied into the episode's folder."""


@dataclass
class LLMAgentConfig:
    """A model behind an OpenAI-compatible chat completions endpoint."""

    name: str = "llm"
    base_url: str = "https://api.openai.com/v1"
    """The endpoint's base URL."""
    model: str = MISSING
    """The model name (required)."""
    api_key_env: str = "OPENAI_API_KEY"
    """The environment variable that holds the key ('' for none). The key itself is never config."""
    temperature: float = 0.0
    max_tokens: int = 1024
    max_observation_chars: int = 8000
    """Observations sent to the model are cut to their head and tail beyond this."""
    timeout_s: float = DEFAULT_TIMEOUT_S
    """Per request."""
    max_retries: int = DEFAULT_MAX_RETRIES
    """Retries of a transient failure (connection, 429, 5xx) before the attempt counts as an infra failure."""
    capture_tokens: bool = False
    """Ask the server for each reply's token ids and log-probabilities (vLLM's and SGLang's ``logprobs`` and
    ``return_token_ids``) and keep them in the episode's trajectory and ``agent/tokens.jsonl``. Off by
    default: OpenAI's own API refuses the fields."""


@dataclass
class RunConfig(EpisodeSettings):
    """The whole run: one choice per group, and the run settings (the episode settings, inherited, are
    top-level keys: ``episodes_per_task=4``)."""

    backend: Any = MISSING
    pool: Any = MISSING
    suite: Any = MISSING
    agent: Any = MISSING
    benchmark: Any = MISSING
    env: EnvKind = EnvKind.shell
    """``shell`` (Shell-v0) or ``python`` (Python-v0)."""
    verification: VerificationChoice = VerificationChoice.task
    """``task`` (each task's own mode), ``strict``, ``toolchain`` or ``shared`` for every episode."""
    network: Any = "task"
    """``task`` (each task's policy per phase, as in Harbor), ``offline``, ``public``, a list of
    allowed hosts (an allowlist for both phases), or ``{build: ..., agent: ..., verifier: ...}``; a plain
    value keeps the task's build policy (public)."""
    gpu_backend: Any = None
    """A second backend for the tasks that ask for GPUs (``{name: modal, gpu: A10G, ...options}``);
    None: every task on ``backend``."""
    pass_at_k: list[int] = field(default_factory=lambda: [1])
    """k values of pass@k in the summary (each <= episodes_per_task; larger ones are skipped)."""
    output_dir: str | None = None
    """Where results go; None: Hydra's run directory (outputs/<date>/<time>)."""
    resume: Any = False
    """true: continue the run in ``output_dir`` (or the latest unfinished run); or a run directory."""
    progress: bool = True
    """Show a progress bar on stderr."""
    ledger_fsync: bool = True
    """fsync each ledger record before moving on (durable against power loss, not just a crash)."""
    processes: int = 1
    """Runner processes that play the episodes (``pool.size`` at once between them): 1 plays them in this
    process's threads; N > 1 starts N worker processes sharing the run's ledger, for a machine whose
    cores one Python interpreter cannot keep busy (pool=direct only; see docs/evaluations.md)."""
