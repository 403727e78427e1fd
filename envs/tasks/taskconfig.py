"""``task.toml``: the Harbor / Terminal-Bench 2 task settings snapgym understands.

Field names are Harbor's. Every field Harbor documents for single-step tasks
is read; a field snapgym cannot honour (MCP servers, multi-step tasks, a
non-root user) is rejected with an error that names it, rather than silently
ignored.

The network, as in Harbor (schema 1.4): ``[environment] network_mode``
(``public``, the default; ``no-network``; ``allowlist`` with
``allowed_hosts``) is the baseline of both phases; the deprecated
``allow_internet`` means ``public`` (true) or ``no-network`` (false) when
neither ``network_mode`` nor ``allowed_hosts`` is set; ``[agent]`` and
``[verifier]`` may each set their own ``network_mode``/``allowed_hosts``.
The build (Dockerfile ``RUN`` steps and ``snapgym.verifier_setup``) has no
setting in the format; it is public, as Harbor builds, unless a run says
otherwise (see :mod:`envs.episode.network`).
``allowed_hosts`` goes only with ``allowlist`` (see ``pool.network.policy``
for the host syntax). Resources (``cpus``, ``memory``/``memory_mb``,
``storage``/``storage_mb``, ``gpus``/``gpu_types``) go to the backend, which
refuses what it cannot give (GPUs on a backend without them). ``[metadata]`` is free-form and kept as is.

snapgym adds one optional table, ``[snapgym]``:

``verifier_setup``
    Commands run at build time, after the Dockerfile, that install what
    ``tests/test.sh`` needs (e.g. ``["pip install pytest==8.4.1"]``), so that
    verification never needs the network.
``verification``
    ``"strict"`` (the default) or ``"shared"``: how the verifier is kept apart
    from the agent (see ``envs.tasks.verifier``). Declare ``"shared"`` when the tests
    need a process the agent started or changes outside the outputs.
``outputs``
    strict: the directories whose end state the verifier sees (absolute
    paths; default: the working directory). Everything else comes from the
    known-good snapshot.
``protected``
    Name patterns (globs) of the test infrastructure in the outputs that the
    verifier takes from the known-good snapshot (see ``envs.tasks.protect``);
    not declared: pytest's defaults; ``[]``: none.
"""

from __future__ import annotations

import os
import posixpath
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from envs.errors import TaskError
from pool.errors import ConfigError
from pool.network.policy import NetworkMode, NetworkPolicy, PhasePolicies
from pool.resources import DEFAULT_TIMEOUT_S, Resources, parse_size_mb

_TOP_KEYS = {
    "version",
    "schema_version",
    "metadata",
    "task",
    "source",
    "verifier",
    "agent",
    "environment",
    "solution",
    "artifacts",
}
_VERIFICATION_MODES = {"strict", "shared"}


@dataclass(frozen=True, slots=True)
class EnvironmentSettings:
    """``[environment]``: how the start state is built and what it may use."""

    build_timeout_s: float = DEFAULT_TIMEOUT_S
    docker_image: str | None = None
    cpus: float | None = None
    memory_mb: int | None = None
    storage_mb: int | None = None
    gpus: int = 0
    gpu_types: tuple[str, ...] = ()
    healthcheck: str | None = None
    workdir: str | None = None
    """Where the agent's commands run; overrides the Dockerfile's last WORKDIR."""
    env: Mapping[str, str] = field(default_factory=dict)
    """Variables resolved from the host when the task loads (``${VAR}``,
    ``${VAR:-default}``); given to episode commands, never baked into a snapshot."""

    @property
    def resources(self) -> Resources:
        """What each sandbox of the task gets (``cpus``, ``memory``, ``storage``, ``gpus``)."""
        return Resources(
            cpus=self.cpus,
            memory_mb=self.memory_mb,
            storage_mb=self.storage_mb,
            gpus=self.gpus,
            gpu_types=self.gpu_types,
        )


@dataclass(frozen=True, slots=True)
class TaskSettings:
    """Everything ``task.toml`` says, validated."""

    metadata: Mapping[str, Any] = field(default_factory=dict)
    name: str | None = None
    """``[task].name`` when the task is a registry package (``org/name``)."""
    description: str = ""
    agent_timeout_s: float | None = None
    verifier_timeout_s: float = DEFAULT_TIMEOUT_S
    verifier_env: Mapping[str, str] = field(default_factory=dict)
    solution_env: Mapping[str, str] = field(default_factory=dict)
    environment: EnvironmentSettings = field(default_factory=EnvironmentSettings)
    verifier_setup: tuple[str, ...] = ()
    verification: str | None = None
    """``[snapgym] verification``: "strict", "shared", or None (not declared: strict)."""
    outputs: tuple[str, ...] = ()
    """``[snapgym] outputs``: directories the strict verifier sees (empty: the working directory)."""
    protected: tuple[str, ...] | None = None
    """``[snapgym] protected``: name patterns taken from the known-good snapshot (None: the defaults)."""
    network: PhasePolicies = field(
        default_factory=lambda: PhasePolicies(agent=NetworkPolicy.public(), verifier=NetworkPolicy.public())
    )
    """The network policy of each phase (Harbor's default: public)."""


def parse_task_toml(path: Path) -> TaskSettings:
    """Read and validate a task.toml.

    Raises:
        TaskError: the file is not valid TOML, or a field is unknown, of the
            wrong type, or asks for something snapgym does not support.
    """
    try:
        raw = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise TaskError(f"{path} is not valid TOML: {exc}") from None
    except OSError as exc:
        raise TaskError(f"cannot read {path}: {exc.strerror}") from None
    return _Reader(path, raw).settings()


class _Reader:
    """Walks a parsed task.toml, naming the file and field in every error."""

    def __init__(self, path: Path, raw: dict[str, Any]) -> None:
        self.path = path
        self.raw = raw

    def settings(self) -> TaskSettings:
        if "steps" in self.raw:
            self.fail("steps", "multi-step tasks are not supported; split them into separate tasks")
        unknown = set(self.raw) - _TOP_KEYS - {"snapgym"}
        if unknown:
            self.fail(sorted(unknown)[0], f"unknown table or key; known: {', '.join(sorted(_TOP_KEYS | {'snapgym'}))}")
        if self.raw.get("artifacts", []) != []:  # Harbor's list of files to collect after a trial (schema 1.1)
            self.fail("artifacts", "collecting artifacts is not supported; leave the list empty or remove it")
        task = self.table("task", {"name", "description", "authors", "keywords"})
        verifier = self.table("verifier", {"timeout_sec", "env", "user", "network_mode", "allowed_hosts"})
        agent = self.table("agent", {"timeout_sec", "user", "network_mode", "allowed_hosts"})
        solution = self.table("solution", {"env"})
        snapgym = self.table("snapgym", {"verifier_setup", "verification", "outputs", "protected"})
        for section, table in (("verifier", verifier), ("agent", agent)):
            self.check_user(section, table)
        metadata = self.raw.get("metadata", {})
        if not isinstance(metadata, dict):
            self.fail("metadata", "must be a table")
        return TaskSettings(
            metadata=metadata,
            name=self.opt_str("task.name", task.get("name")),
            description=self.opt_str("task.description", task.get("description")) or "",
            agent_timeout_s=self.opt_positive("agent.timeout_sec", agent.get("timeout_sec")),
            verifier_timeout_s=(
                self.opt_positive("verifier.timeout_sec", verifier.get("timeout_sec")) or DEFAULT_TIMEOUT_S
            ),
            verifier_env=self.str_map("verifier.env", verifier.get("env", {})),
            solution_env=self.str_map("solution.env", solution.get("env", {})),
            environment=self.environment(),
            verifier_setup=self.str_list("snapgym.verifier_setup", snapgym.get("verifier_setup", [])),
            verification=self.verification(snapgym.get("verification")),
            outputs=self.outputs(snapgym.get("outputs", [])),
            protected=self.protected(snapgym.get("protected")),
            network=self.network(agent, verifier),
        )

    def network(self, agent: dict[str, Any], verifier: dict[str, Any]) -> PhasePolicies:
        env = self.raw.get("environment", {})
        baseline = self.policy("environment", env)
        if baseline is None:
            legacy = env.get("allow_internet")
            baseline = NetworkPolicy.offline() if legacy is False else NetworkPolicy.public()
        return PhasePolicies(  # the build: public, as Harbor builds (task.toml has no setting for it)
            agent=self.policy("agent", agent) or baseline, verifier=self.policy("verifier", verifier) or baseline
        )

    def policy(self, section: str, table: dict[str, Any]) -> NetworkPolicy | None:
        """The section's own policy, or None when it sets none (it inherits)."""
        mode, hosts = table.get("network_mode"), table.get("allowed_hosts")
        if mode is None and hosts is None:
            return None
        if mode is None:
            self.fail(f"{section}.allowed_hosts", 'goes with network_mode = "allowlist"; set that too')
        hosts = self.str_list(f"{section}.allowed_hosts", hosts if hosts is not None else [])
        try:
            return NetworkPolicy(NetworkMode.parse(mode), hosts)
        except ConfigError as exc:
            self.fail(f"{section}.network_mode" if hosts == () else f"{section}.allowed_hosts", str(exc))

    def verification(self, value: Any) -> str | None:
        if value is not None and value not in _VERIFICATION_MODES:
            self.fail("snapgym.verification", f"must be one of {sorted(_VERIFICATION_MODES)}, got {value!r}")
        return None if value is None else str(value)

    def protected(self, value: Any) -> tuple[str, ...] | None:
        if value is None:
            return None
        patterns = self.str_list("snapgym.protected", value)
        for pattern in patterns:
            if not pattern or "/" in pattern or "\0" in pattern:
                self.fail("snapgym.protected", f"each pattern is a glob on a file's name (no '/'), got {pattern!r}")
        return patterns

    def outputs(self, value: Any) -> tuple[str, ...]:
        paths = self.str_list("snapgym.outputs", value)
        for path in paths:
            normal = posixpath.normpath(path)
            if not path.startswith("/") or normal == "/" or normal.startswith("//"):
                self.fail("snapgym.outputs", f"each output must be an absolute directory other than /, got {path!r}")
        return tuple(dict.fromkeys(posixpath.normpath(p) for p in paths))

    def environment(self) -> EnvironmentSettings:
        known = {
            "build_timeout_sec", "docker_image", "cpus", "memory_mb", "storage_mb", "memory", "storage", "gpus",
            "gpu_types", "allow_internet", "network_mode", "allowed_hosts", "mcp_servers", "env", "skills_dir",
            "healthcheck", "workdir",
        }  # fmt: skip
        env = self.table("environment", known)
        gpus = self.number("environment.gpus", env.get("gpus", 0))
        if gpus != int(gpus):
            self.fail("environment.gpus", f"must be a whole number, got {gpus!r}")
        if env.get("mcp_servers"):
            self.fail("environment.mcp_servers", "MCP servers are not supported")
        if env.get("skills_dir"):
            self.fail("environment.skills_dir", "skills directories are not supported")
        if "allow_internet" in env and not isinstance(env["allow_internet"], bool):
            self.fail("environment.allow_internet", "must be true or false")
        memory_mb = env.get("memory_mb")
        if "memory" in env:
            memory_mb = self.size_mb("environment.memory", env["memory"])
        storage_mb = env.get("storage_mb")
        if "storage" in env:
            storage_mb = self.size_mb("environment.storage", env["storage"])
        cpus = self.opt_positive("environment.cpus", env.get("cpus"))
        return EnvironmentSettings(
            build_timeout_s=(
                self.opt_positive("environment.build_timeout_sec", env.get("build_timeout_sec")) or DEFAULT_TIMEOUT_S
            ),
            docker_image=self.opt_str("environment.docker_image", env.get("docker_image")),
            cpus=cpus,
            memory_mb=self.opt_mb("environment.memory_mb", memory_mb),
            storage_mb=self.opt_mb("environment.storage_mb", storage_mb),
            gpus=int(gpus),
            gpu_types=self.str_list("environment.gpu_types", env.get("gpu_types", [])),
            healthcheck=self.healthcheck(env.get("healthcheck")),
            workdir=self.workdir(env.get("workdir")),
            env=resolve_host_vars("environment.env", self.str_map("environment.env", env.get("env", {})), self.path),
        )

    def workdir(self, value: Any) -> str | None:
        if value is not None and (not isinstance(value, str) or not value.startswith("/")):
            self.fail("environment.workdir", f"must be an absolute path, got {value!r}")
        return value

    def healthcheck(self, value: Any) -> str | None:
        if value is None:
            return None
        if not isinstance(value, dict) or not isinstance(value.get("command"), str):
            self.fail("environment.healthcheck", "must be a table with a string 'command'")
        return str(value["command"])

    def table(self, name: str, known: set[str]) -> dict[str, Any]:
        value = self.raw.get(name, {})
        if not isinstance(value, dict):
            self.fail(name, "must be a table")
        unknown = set(value) - known
        if unknown:
            key = sorted(unknown)[0]
            self.fail(f"{name}.{key}", f"unknown field; snapgym reads: {', '.join(sorted(known))}")
        return dict(value)

    def check_user(self, section: str, table: dict[str, Any]) -> None:
        user = table.get("user")
        if not (user is None or user == "root" or (type(user) is int and user == 0)):
            self.fail(
                f"{section}.user", "only root is supported; the sandbox's root is already unprivileged on the host"
            )

    def number(self, key: str, value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
            self.fail(key, f"must be a non-negative number, got {value!r}")
        return float(value)

    def opt_number(self, key: str, value: Any) -> float | None:
        return None if value is None else self.number(key, value)

    def opt_mb(self, key: str, value: Any) -> int | None:
        mb = self.opt_number(key, value)
        if mb is not None and mb < 1:
            self.fail(key, f"must be at least 1 (MiB), got {value!r}")
        return None if mb is None else int(mb)

    def opt_positive(self, key: str, value: Any) -> float | None:
        number = self.opt_number(key, value)
        if number == 0:
            self.fail(key, "must be positive")
        return number

    def opt_str(self, key: str, value: Any) -> str | None:
        if value is not None and not isinstance(value, str):
            self.fail(key, f"must be a string, got {value!r}")
        return None if value is None else str(value)

    def str_map(self, key: str, value: Any) -> dict[str, str]:
        if not isinstance(value, dict) or not all(isinstance(v, str | int | float) for v in value.values()):
            self.fail(key, "must be a table of strings")
        return {str(k): str(v) for k, v in value.items()}

    def str_list(self, key: str, value: Any) -> tuple[str, ...]:
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            self.fail(key, "must be a list of strings")
        return tuple(value)

    def size_mb(self, key: str, value: Any) -> int:
        try:
            return parse_size_mb(value, what=key)
        except ConfigError as exc:
            self.fail(key, str(exc).removeprefix(f"{key} "))

    def fail(self, key: str, why: str) -> NoReturn:
        raise TaskError(f"{self.path}: {key}: {why}")


_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-(.*?))?\}")


def resolve_host_vars(key: str, values: Mapping[str, str], path: Path) -> dict[str, str]:
    """Expand ``${VAR}`` and ``${VAR:-default}`` from the host environment."""

    def expand(match: re.Match[str]) -> str:
        name, default = match.group(1), match.group(2)
        if name in os.environ:
            return os.environ[name]
        if default is not None:
            return default
        raise TaskError(f"{path}: {key}: needs the host variable {name}; set it or give a default (${{{name}:-...}})")

    return {k: _VAR.sub(expand, v) for k, v in values.items()}
