"""Config schemas of the benchmark runner, registered with Hydra's ConfigStore.

Every YAML file under ``configs/`` names one of these schemas first in its
defaults list, so Hydra checks names and types of every key while composing,
before any sandbox starts. The ``backend`` group is the exception: a backend's
options are its constructor's keyword arguments, so :func:`check_backend_options`
checks its YAML against that signature, and no YAML restates a default: the
local and Docker YAMLs start from ``backend/options/<name>``, every option with
its default read from the constructor (``pool.backends.option_defaults``); the
cloud backends' YAMLs take the options they share from ``backend/cloud/options``
(``pool.backends.remote.options.RemoteOptions``).
Hydra's ``+key=value`` slips past that check, and a required key (``???``) is
only noticed when read, so the runner also calls ``reject_unknown_keys`` and
``require_values`` before it starts anything.

The schemas are plain (mutable) dataclasses, not the frozen ones the style
guide asks for: OmegaConf marks a frozen dataclass read-only, which would
reject every command-line override.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from pool import ConfigError
from pool.backends import check_options


@dataclass
class WorkspaceConfig:
    """The deterministic workspace every method of reset_latency starts from."""

    n_files: int = 1000
    """Number of files, spread over subdirectories of 100."""
    mean_file_bytes: int = 50_000
    """Mean file size; sizes are drawn uniformly from 0.5x to 1.5x of it."""
    seed: int = 0
    """Seed of ``random.Random`` that draws sizes and contents."""


@dataclass
class ResetLatencyRepetitions:
    """Timed iterations per method (warm-up iterations come on top)."""

    restore: int = 200
    """Dirty the sandbox, then time ``sandbox.restore()``."""
    restore_immediate: int = 100
    """Dirty and restore untimed, then time a second restore right away."""
    create: int = 30
    """Time ``backend.create(snapshot)``."""
    exec_true: int = 200
    """Time ``sandbox.exec("true")``."""
    fork16: int = 10
    """Time ``backend.fork(snapshot, 16)``."""
    verify_strict: int = 50
    """Dirty the sandbox, then time ``sandbox.begin_verification`` of a strict plan (outputs: the workspace)."""
    verify_shared: int = 50
    """The same with a shared plan (the workspace frozen)."""
    naive_copy: int = 20
    """Time ``shutil.copytree`` of the workspace plus one fresh process."""
    docker_recreate: int = 10
    """Time removing a container and creating and starting a new one."""
    other_restore: int = 30
    """Time ``sandbox.restore()`` of a dirtied sandbox on each backend of ``other_backends``."""
    other_create: int = 10
    """Time ``backend.create(snapshot)`` on each backend of ``other_backends``."""


@dataclass
class ResetLatencyTargets:
    """Thresholds reported as met or missed in summary.json."""

    restore_p50_ms: float = 5.0
    """restore p50 must be at most this."""
    restore_p99_ms: float = 20.0
    """restore p99 must be at most this."""
    exec_true_p50_ms: float = 3.0
    """exec_true p50 must be at most this."""
    fork16_p50_ms: float = 50.0
    """fork16 p50 must be at most this."""
    restore_vs_docker_min: float = 30.0
    """docker_recreate p50 / restore p50 must be at least this."""
    restore_vs_naive_min: float = 10.0
    """naive_copy p50 / restore p50 must be at least this."""


@dataclass
class DockerConfig:
    """The Docker re-creation baseline."""

    enabled: bool = True
    """Measure it when an engine is reachable; False records it as skipped."""
    repository: str = "snapgym-bench"
    """Repository name of the image imported for the run (removed afterwards)."""


@dataclass
class ResetLatencyConfig:
    """How fast a dirty sandbox gets back to its snapshot, against the baselines."""

    name: str = "reset_latency"
    """Scenario name; selects the module in ``benchmarks/scenarios``."""
    warmup: int = 3
    """Iterations run and discarded before each method's timed ones."""
    repetitions: ResetLatencyRepetitions = field(default_factory=ResetLatencyRepetitions)
    """Timed iterations per method."""
    workspace: WorkspaceConfig = field(default_factory=WorkspaceConfig)
    """The workspace baked into the snapshot, the host copy and the image."""
    naive_tmp_dir: str | None = None
    """Where the naive baseline copies to; None: the system temp dir."""
    docker: DockerConfig = field(default_factory=DockerConfig)
    """The Docker baseline."""
    other_backends: list[str] = field(default_factory=lambda: ["docker"])
    """Backends measured side by side with the configured one (restore and create of the same
    workspace, default options), each skipped with the reason when it cannot run here."""
    targets: ResetLatencyTargets = field(default_factory=ResetLatencyTargets)
    """Thresholds checked in the summary."""


@dataclass
class EgressRepetitions:
    """Timed iterations per pair of methods; the two of a pair are measured interleaved, so they share a count."""

    reset: int = 40
    """``reset`` and ``reset_with_network``: dirty, then time ``restore()`` (plus ``set_network``)."""
    exec_true: int = 100
    """``exec_true`` and ``exec_true_with_proxy_env``: time ``sandbox.exec("true")``."""
    requests: int = 100
    """Requests timed per request method (``https_direct``, ``https_via_proxy``, ``http_*``)."""


@dataclass
class EgressBenchConfig:
    """What the egress proxy costs: per episode, per command and per request."""

    name: str = "egress"
    """Scenario name; selects the module in ``benchmarks/scenarios``."""
    warmup: int = 3
    """Iterations (requests, for the request methods) run and discarded before the timed ones."""
    repetitions: EgressRepetitions = field(default_factory=EgressRepetitions)
    """Timed iterations per pair of methods."""
    plain_http: bool = True
    """Also time plain-HTTP requests (``http_direct``, ``http_via_proxy``: an absolute-form GET to the proxy)."""


def register_configs() -> None:
    """Store the schemas under the names the YAML defaults lists refer to."""
    store = ConfigStore.instance()
    store.store(group="benchmark", name="reset_latency_schema", node=ResetLatencyConfig)
    store.store(group="benchmark", name="egress_schema", node=EgressBenchConfig)
    from benchmarks import schemas
    from benchmarks.scenarios.aio.inflight import AioBenchConfig
    from benchmarks.scenarios.burst import BurstConfig
    from benchmarks.scenarios.cost import CostConfig
    from benchmarks.scenarios.durable import DurableBenchConfig
    from benchmarks.scenarios.eval import EvalBenchConfig
    from benchmarks.scenarios.fork import ForkBenchConfig
    from benchmarks.scenarios.idle import IdleConfig
    from benchmarks.scenarios.integrity import IntegrityBenchConfig
    from benchmarks.scenarios.pool import PoolBenchConfig
    from benchmarks.scenarios.soak import SoakConfig
    from benchmarks.scenarios.throughput import ThroughputConfig

    store.store(name="snapgym_schema", node=schemas.RunConfig)
    store.store(group="benchmark", name="pool_schema", node=PoolBenchConfig)
    store.store(group="benchmark", name="eval_schema", node=EvalBenchConfig)
    store.store(group="benchmark", name="throughput_schema", node=ThroughputConfig)
    store.store(group="benchmark", name="fork_schema", node=ForkBenchConfig)
    store.store(group="benchmark", name="burst_schema", node=BurstConfig)
    store.store(group="benchmark", name="idle_schema", node=IdleConfig)
    store.store(group="benchmark", name="durable_schema", node=DurableBenchConfig)
    store.store(group="benchmark", name="aio_schema", node=AioBenchConfig)
    store.store(group="benchmark", name="integrity_schema", node=IntegrityBenchConfig)
    store.store(group="benchmark", name="cost_schema", node=CostConfig)
    store.store(group="benchmark", name="soak_schema", node=SoakConfig)
    store.store(group="pool", name="pool_schema", node=schemas.PoolSettings)
    store.store(group="suite", name="suite_schema", node=schemas.SuiteConfig)
    store.store(group="suite", name="dir_suite_schema", node=schemas.DirSuiteConfig)
    store.store(group="agent", name="oracle_schema", node=schemas.OracleAgentConfig)
    store.store(group="agent", name="noop_schema", node=schemas.NoopAgentConfig)
    store.store(group="agent", name="replay_schema", node=schemas.ReplayAgentConfig)
    store.store(group="agent", name="llm_schema", node=schemas.LLMAgentConfig)
    store.store(group="agent", name="installed_schema", node=schemas.InstalledAgentConfig)
    store.store(group="agent", name="python_schema", node=schemas.PythonAgentConfig)
    from pool.backends import cloud_option_defaults, option_defaults

    store.store(group="backend/cloud", name="options", node=_open_mappings(cloud_option_defaults()))
    for name in ("local", "docker"):  # their SDK-free constructors are the schema (no Docker SDK is imported)
        store.store(group="backend/options", name=name, node=_open_mappings(option_defaults(name)))


def _open_mappings(options: dict[str, Any]) -> DictConfig:
    """The options as a config node in which a mapping that starts empty (a registry's ``mirrors``,
    ``credentials``) takes keys of the user's: ``backend.registry.mirrors={docker.io:[...]}`` works
    without Hydra's ``++``, while every other key stays checked."""
    node = OmegaConf.create(options)

    def walk(config: DictConfig, plain: dict[str, Any]) -> None:
        for key, value in plain.items():
            if isinstance(value, dict):
                child = config[key]
                assert isinstance(child, DictConfig)
                if value:
                    walk(child, value)
                else:
                    OmegaConf.set_struct(child, False)

    walk(node, options)
    return node


def check_backend_options(cfg: DictConfig) -> None:
    """Refuse a backend option its constructor does not take, naming the valid ones.

    Raises:
        ConfigError: an unknown backend, an unknown option, or a backend without ``name``.
    """
    options = OmegaConf.to_container(cfg.backend, resolve=True)
    if not isinstance(options, dict) or "name" not in options:
        raise ConfigError("the backend config needs a 'name' (e.g. backend=local or backend=docker)")
    name = options.pop("name")
    check_options(str(name), {str(key): value for key, value in options.items()})


def check_pool_installed(cfg: DictConfig) -> None:
    """Refuse ``pool=ray`` where Ray is not installed, before any sandbox starts (the ``ray`` extra).

    Raises:
        ConfigError: ``pool=ray needs Ray: pip install 'snapgym[ray]'``.
    """
    if str(OmegaConf.select(cfg, "pool.kind")).rsplit(".", 1)[-1] == "ray":
        from pool.cluster import require_ray

        require_ray()


def reject_unknown_keys(cfg: DictConfig, prefix: str = "") -> None:
    """Fail on keys that the node's schema lacks, at any depth.

    Hydra lets ``+benchmark.typo=1`` add a key to a structured config, and
    ``OmegaConf.to_object`` then drops it silently; this makes it an error.

    Raises:
        ConfigError: naming every unknown key by its full dotted name.
    """
    unknown = _unknown_keys(cfg, prefix)
    if unknown:
        raise ConfigError(f"unknown config key(s): {', '.join(unknown)}; check the spelling in the YAML or override")


def require_values(cfg: DictConfig) -> None:
    """Fail on required keys (``???`` in a schema, such as ``agent.model``) that nothing set.

    Raises:
        ConfigError: naming every such key by its full dotted name.
    """
    missing = sorted(OmegaConf.missing_keys(cfg))
    if missing:
        raise ConfigError(f"required config key(s) not set: {', '.join(missing)}; give them as key=value")


def _unknown_keys(node: DictConfig, prefix: str) -> list[str]:
    schema = OmegaConf.get_type(node)
    known = {f.name for f in dataclasses.fields(schema)} if dataclasses.is_dataclass(schema) else None
    found: list[str] = []
    for key in map(str, node):
        name = prefix + key
        if known is not None and key not in known:
            found.append(name)
        elif not OmegaConf.is_missing(node, key) and isinstance(child := node[key], DictConfig):
            found.extend(_unknown_keys(child, f"{name}."))
    return found
