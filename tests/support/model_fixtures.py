"""A stand-in model API on the test internet, and egress settings that route an agent's model calls to it.

``model_server.py`` runs inside the test internet's namespace (``net_fixtures``)
at ``models.test:8443`` over HTTPS (a certificate of the test CA) and speaks
Anthropic Messages and OpenAI Chat Completions / Responses, scripted. Test
modules load it with ``pytest_plugins = ["tests.support.net_fixtures", "tests.support.model_fixtures"]``
(which gives them the module-scoped ``model_api`` fixture). It has no asserts
of its own (PYTEST_DONT_REWRITE).
"""

from __future__ import annotations

import contextlib
import json
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.support.net_fixtures import TestInternet, egress_options, stop_server

SERVER = Path(__file__).with_name("model_server.py")
NAME = "models.test"
PORT = 8443
KEY_VARIABLE = "SNAPGYM_TEST_MODEL_KEY"
"""The variable the tests' model routes read their key from."""
START_TIMEOUT_S = 20.0


@dataclass(frozen=True, slots=True)
class StandInModel:
    """A running stand-in model API; its log is read fresh on every call."""

    url: str
    """``https://models.test:8443``."""
    address: str
    """The address ``models.test`` maps to."""
    api_key: str
    """The only key it accepts (a fresh random one per fixture)."""
    root: Path
    born: float = field(default_factory=time.time)
    """When the key was made (Unix time): nothing written before can hold it."""

    def script(self, *entries: dict[str, Any]) -> None:
        """What the model says from now on, one entry per call, the last repeating (see model_server.py)."""
        (self.root / "script.json").write_text(json.dumps(list(entries)))

    def requests(self) -> list[dict[str, Any]]:
        """Every request it received, oldest first (headers lower-cased)."""
        path = self.root / "requests.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@contextlib.contextmanager
def open_model_api(internet: TestInternet, folder: Path) -> Iterator[StandInModel]:
    """Start the stand-in in the test internet's namespace; stop it on exit."""
    folder.mkdir(parents=True, exist_ok=True)
    address = internet.addresses[-1]
    issued = internet.ca.issue([NAME], stem="models")
    model = StandInModel(url=f"https://{NAME}:{PORT}", address=address, api_key=f"sk-test-{secrets.token_hex(24)}",
                         root=folder)  # fmt: skip
    model.script({"text": "hello from the stand-in"})
    ready = folder / "ready"
    config = {
        "address": address, "port": PORT, "cert": str(issued.cert_path), "key": str(issued.key_path),
        "api_key": model.api_key, "script": str(folder / "script.json"), "log": str(folder / "requests.jsonl"),
        "ready_file": str(ready),
    }  # fmt: skip
    (folder / "config.json").write_text(json.dumps(config))
    with (folder / "server.log").open("wb") as err:
        server = subprocess.Popen(
            ["ip", "netns", "exec", internet.namespace, sys.executable, str(SERVER), str(folder / "config.json")],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not ready.exists():
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the stand-in model API did not start: {(folder / 'server.log').read_text()}")
            time.sleep(0.05)
        yield model
    finally:
        stop_server(server)


def model_routes(model: StandInModel, **overrides: Any) -> list[dict[str, Any]]:
    """An anthropic and an openai route to the stand-in, keyed by :data:`KEY_VARIABLE`."""
    common = {"upstream": model.url, "credential_env": KEY_VARIABLE, **overrides}
    return [{"name": "anthropic", "api": "anthropic", **common}, {"name": "openai", "api": "openai", **common}]


def model_egress(internet: TestInternet, model: StandInModel, **route_overrides: Any) -> dict[str, Any]:
    """Egress settings that reach the test internet and route the agent's model calls to the stand-in."""
    options = egress_options(internet)
    options["hosts"] = {**options["hosts"], NAME: model.address}
    options["models"] = model_routes(model, **route_overrides)
    return options


@pytest.fixture(scope="module")
def model_api(internet: TestInternet, tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandInModel]:
    """The stand-in model API, with its key in :data:`KEY_VARIABLE` of this process for the module."""
    with open_model_api(internet, tmp_path_factory.mktemp("model-api")) as model, pytest.MonkeyPatch.context() as mp:
        mp.setenv(KEY_VARIABLE, model.api_key)
        yield model
