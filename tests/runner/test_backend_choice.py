"""Any backend by name, end to end: Hydra's ``backend=docker``, ``gym.make(..., backend="docker")``,
a wrong backend option named with the valid ones, and tasks a backend cannot verify skipped with the reason."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import pytest

import envs
from pool import ConfigError, LocalBackend
from tests.support.backends import backend_missing

REPO = Path(__file__).resolve().parents[2]
needs_docker = backend_missing("docker")


def _run(*overrides: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    return subprocess.run(
        [sys.executable, "-m", "benchmarks.run", "progress=false", "benchmark.plots=false", *overrides],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip


def test_a_mistyped_backend_option_names_the_valid_ones(tmp_path: Path) -> None:
    """+backend.memory_limt_mb=512 fails before any sandbox starts, with the option it meant."""
    done = _run("+backend.memory_limt_mb=512", f"hydra.run.dir={tmp_path}")
    assert done.returncode != 0
    assert "did you mean 'memory_limit_mb'?" in done.stderr and "its options are:" in done.stderr


def test_an_unknown_backend_names_the_known_ones(tmp_path: Path) -> None:
    """backend=dokcer is Hydra's missing-option error listing the YAMLs, docker among them."""
    done = _run("backend=dokcer", f"hydra.run.dir={tmp_path}")
    assert done.returncode != 0 and "docker" in done.stderr


def test_gym_make_refuses_options_it_cannot_pass() -> None:
    """backend_options with a backend instance, or a wrong option, is a clear ConfigError."""
    with pytest.raises(ConfigError, match="did you mean 'memory_limit_mb'"):
        gym.make("snapgym/Shell-v0", task="log-error-count", backend="local", backend_options={"memory_limt_mb": 1})


@needs_docker
@pytest.mark.docker
def test_gym_make_runs_an_episode_on_the_docker_backend() -> None:
    """gym.make(..., backend="docker"): the same task, the same observations, solved on Docker."""
    env = gym.make("snapgym/Shell-v0", task="log-error-count", backend="docker", disable_env_checker=True)
    try:
        _, info = env.reset(seed=0)
        assert info["backend"] == "docker" and info["verification"] == "strict"
        obs, *_ = env.step("awk '$9 ~ /^5/' access.log | wc -l > answer.txt; cat answer.txt")
        assert obs["output"] == "127\n[exit code 0]"
        _, reward, terminated, _, info = env.step("submit")
        assert (reward, terminated, info["scored"]) == (1.0, True, True)
    finally:
        env.close()


@needs_docker
@pytest.mark.docker
def test_the_runner_on_the_docker_backend_skips_what_it_cannot_verify(tmp_path: Path) -> None:
    """backend=docker: a strict task scores 1.0; a shared one is skipped with the reason (shared verification
    on Docker is opt-in), not played as an infrastructure failure."""
    run_dir = tmp_path / "run"
    done = _run(
        "backend=docker", "suite.include=[log-error-count,start-kv-service]", f"output_dir={run_dir}",
        f"hydra.run.dir={tmp_path / 'hydra'}",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["by_task"]["log-error-count"]["mean_reward"] == 1.0
    assert "start-kv-service" not in summary["by_task"]
    assert "not 'shared'" in summary["skipped_tasks"]["start-kv-service"]


def test_an_environment_labels_its_sandboxes(backend: LocalBackend) -> None:
    """labels= reach every sandbox the environment makes, beside the backend's owner label."""
    env = envs.ShellEnv("log-error-count", backend=backend, labels={"snapgym.run": "run-42"})
    try:
        env.reset()
        assert env.sandbox is not None
        assert env.sandbox.labels["snapgym.run"] == "run-42" and env.sandbox.labels["snapgym.owner"]
    finally:
        env.close()
    with pytest.raises(ConfigError, match="label key"):
        envs.ShellEnv("log-error-count", backend=backend, labels={"no spaces": "x"})


@pytest.mark.parametrize("name", ["e2b", "daytona", "modal"])
def test_a_cloud_backends_config_is_its_constructors_options_with_the_shared_defaults(name: str) -> None:
    """configs/backend/<cloud>.yaml restates no shared default: every option is a key (so backend.<key>=...
    overrides it), the shared ones hold RemoteOptions' defaults, and an override reaches them."""
    from omegaconf import OmegaConf

    from benchmarks.cli import compose_config
    from benchmarks.config import register_configs
    from pool.backends import backend_options, cloud_option_defaults
    from pool.backends.remote.options import RemoteOptions

    register_configs()
    composed = OmegaConf.to_container(compose_config([f"backend={name}"]).backend)
    assert isinstance(composed, dict) and composed.pop("name") == name
    options = backend_options(name)
    assert set(composed) <= set(options) - {"api_key", "token_id", "token_secret"}
    shared = cloud_option_defaults()
    assert {key: composed[key] for key in shared} == shared
    assert all(options[key].default == default for key, default in RemoteOptions.defaults().items())
    overridden = compose_config([f"backend={name}", "backend.prewarm=false", "backend.max_creates_per_s=null",
                                 "backend.registry.insecure_registries=[127.0.0.1:5000]",
                                 "backend.registry.mirrors={docker.io:[mirror.example:5000]}"])  # fmt: skip
    assert overridden.backend.prewarm is False and overridden.backend.max_creates_per_s is None
    assert list(overridden.backend.registry.insecure_registries) == ["127.0.0.1:5000"]
    assert dict(overridden.backend.registry.mirrors) == {"docker.io": ["mirror.example:5000"]}


@pytest.mark.parametrize("name", ["local", "docker"])
def test_a_backends_config_holds_every_constructor_option_with_its_default(name: str) -> None:
    """configs/backend/<name>.yaml restates no default: every keyword of the constructor is a key with the
    constructor's default (so backend.prewarm=false works without ``+``), settings values are mappings of
    their fields, and the YAML's composition hands the backend exactly what it would take by default."""
    from omegaconf import OmegaConf

    from benchmarks.cli import compose_config
    from benchmarks.config import register_configs
    from pool.backends import backend_options
    from pool.build.registry.settings import RegistrySettings, registry_settings
    from pool.egress.settings import EgressSettings

    register_configs()
    composed = OmegaConf.to_container(compose_config([f"backend={name}"]).backend)
    assert isinstance(composed, dict) and composed.pop("name") == name
    options = backend_options(name)
    assert set(composed) == set(options)
    plain = {key: value for key, value in composed.items() if not isinstance(value, dict)}
    assert all(options[key].default == value for key, value in plain.items()), plain
    assert composed["egress"]["hosts"] == [] and composed["egress"]["cache"]["mode"] == "off"
    overridden = compose_config([f"backend={name}", "backend.prewarm=false", 'backend.egress.hosts=["m=10.0.0.5"]'])
    assert overridden.backend.prewarm is False and list(overridden.backend.egress.hosts) == ["m=10.0.0.5"]
    assert EgressSettings.parse(composed["egress"]) == EgressSettings()  # the same as leaving it None
    if name == "local":
        assert registry_settings(composed["registry"]) == RegistrySettings()


def test_registry_mirrors_and_credentials_are_set_as_users_write_them() -> None:
    """``backend.registry.mirrors={docker.io:[...]}`` (no ``++``) reaches the backend's registry
    settings; a mistyped key next to it is still refused by name."""
    from benchmarks.cli import check_nested_keys, compose_config
    from benchmarks.config import register_configs
    from pool.build.registry.settings import registry_settings

    register_configs()
    mirror = "backend.registry.mirrors={docker.io:[127.0.0.1:5000],ghcr.io:[127.0.0.1:5001]}"
    credentials = "backend.registry.credentials={registry.example:{username:u,password:p}}"
    composed = compose_config(["backend=local", mirror, credentials]).backend.registry
    settings = registry_settings(dict(composed))
    assert dict(settings.mirrors) == {"docker.io": ("127.0.0.1:5000",), "ghcr.io": ("127.0.0.1:5001",)}
    assert settings.credentials["registry.example"].username == "u"
    with pytest.raises(ConfigError, match="did you mean mirrors"):
        check_nested_keys(["backend=local", "backend.registry.mirorrs={docker.io:[x]}"])
