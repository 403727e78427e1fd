"""``egress.trust_host_cas``: sandboxes trust this machine's CA bundle besides their image's own, so
a mirror whose CA the machine trusts is trusted inside a task's image too."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pool import ConfigError, LocalBackend, Template
from pool.egress import EgressSettings, NetworkPolicy, Phase
from pool.egress.sandboxside import SYSTEM_BUNDLES
from tests.support.backends import LIMITS

HOST_BUNDLE = next((path for path in SYSTEM_BUNDLES if os.path.isfile(path)), None)
pytestmark = pytest.mark.skipif(HOST_BUNDLE is None, reason="this machine has no system CA bundle")


def test_the_host_bundle_joins_the_extra_cas_once() -> None:
    settings = EgressSettings.parse({"trust_host_cas": True, "extra_ca_files": [HOST_BUNDLE]})
    assert settings.extra_ca_files == (HOST_BUNDLE,)
    assert EgressSettings.parse({}).extra_ca_files == ()
    with pytest.raises(ConfigError, match="unknown egress setting"):
        EgressSettings.parse({"trust_host_ca": True})


def test_a_sandbox_with_network_trusts_the_hosts_cas(tmp_path: Path) -> None:
    assert HOST_BUNDLE is not None
    first = Path(HOST_BUNDLE).read_text().split("-----END CERTIFICATE-----")[0].splitlines()[-1]
    with LocalBackend(store_dir=tmp_path / "store", **LIMITS, egress={"trust_host_cas": True}) as backend:
        snap = backend.build(Template(name="host-cas", workdir="/w"))
        with backend.create(snap) as sandbox:
            sandbox.set_network(NetworkPolicy.public(), phase=Phase.AGENT)
            found = sandbox.exec('echo "$SSL_CERT_FILE $REQUESTS_CA_BUNDLE"; cat "$SSL_CERT_FILE"')
    bundle, requests_bundle = found.stdout.splitlines()[0].split()
    assert bundle == requests_bundle and first in found.stdout


def test_the_runner_takes_the_switch_without_plus(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.run", "backend.egress.trust_host_cas=true", "--cfg", "job"],
        cwd=Path(__file__).parents[2], capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert "trust_host_cas: true" in done.stdout
