"""The fake internet of the egress tests works, records what reaches it, and leaves nothing behind."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.fixtures.net_fixtures import (
    NamespaceUnavailable,
    TestInternet,
    namespaces_usable,
    open_internet,
    publish_installer,
    publish_wheel,
    wait_until,
)
from tests.support.needs import skip_missing

pytest_plugins = ["tests.support.fixtures.net_fixtures"]


def curl(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["curl", "-sS", "--max-time", "10", *args], capture_output=True, text=True, env=env)


def direct(internet: TestInternet, name: str) -> list[str]:
    """curl options that reach ``name`` at its namespace address, trusting the test CA."""
    return ["--resolve", f"{name}:443:{internet.hosts[name]}", "--resolve", f"{name}:80:{internet.hosts[name]}",
            "--cacert", str(internet.ca.cert_path)]  # fmt: skip


def test_https_echo_is_logged(internet: TestInternet) -> None:
    done = curl(*direct(internet, "example.com"), "-H", "X-Probe: 1", "https://example.com/_echo?q=1")
    assert done.returncode == 0, done.stderr
    echo = json.loads(done.stdout)
    assert (echo["method"], echo["path"], echo["host"], echo["tls"]) == ("GET", "/_echo?q=1", "example.com", True)
    assert echo["sni"] == "example.com"
    assert echo["headers"]["X-Probe"] == "1"
    assert echo["client"].startswith(f"{internet.host_address}:")
    logged = internet.requests("example.com")
    assert [(r["path"], r["tls"], r["client"], r["status"]) for r in logged] == [
        ("/_echo?q=1", True, internet.host_address, 200)
    ]
    assert internet.requests("github.com") == []


def test_static_files_by_virtual_host(internet: TestInternet) -> None:
    (internet.site("github.com") / "hello.txt").write_text("hello from github\n")
    ok = curl(*direct(internet, "github.com"), "http://github.com/hello.txt")
    assert ok.stdout == "hello from github\n"
    head = curl(*direct(internet, "github.com"), "-I", "https://github.com/hello.txt")
    assert "content-length: 18" in head.stdout.lower()
    missing = curl(*direct(internet, "github.com"), "-o", "/dev/null", "-w", "%{http_code}", "https://github.com/nope")
    assert missing.stdout == "404"
    elsewhere = curl(*direct(internet, "example.com"), "-o", "/dev/null", "-w", "%{http_code}",
                     "https://example.com/hello.txt")  # fmt: skip
    assert elsewhere.stdout == "404"
    assert [(r["method"], r["tls"]) for r in internet.requests("github.com")] == [
        ("GET", False), ("HEAD", True), ("GET", True)
    ]  # fmt: skip


def test_other_test_lives_on_the_third_address(internet: TestInternet) -> None:
    assert internet.hosts["other.test"] == internet.addresses[1]
    done = curl(*direct(internet, "other.test"), "https://other.test/_echo")
    assert json.loads(done.stdout)["server"] == f"{internet.addresses[1]}:443"


def test_udp_datagrams_are_logged(internet: TestInternet) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        udp.sendto(b"\x12\x34query", (internet.addresses[0], 53))
    datagrams = wait_until(internet.udp_datagrams)
    assert [(d["server"], d["data"]) for d in datagrams] == [(f"{internet.addresses[0]}:53", b"\x12\x34query".hex())]


def test_tcp_echo(internet: TestInternet) -> None:
    with socket.create_connection((internet.addresses[2], 7), timeout=5) as conn:
        conn.sendall(b"ping")
        assert conn.recv(16) == b"ping"
    assert [c["server"] for c in internet.tcp_connections()] == [f"{internet.addresses[2]}:7"]


def test_upstream_proxy_relays_and_logs(internet: TestInternet) -> None:
    ca = str(internet.ca.cert_path)
    tunnel = curl("--proxy", internet.upstream_proxy, "--cacert", ca, "https://api.example.com/_echo")
    assert json.loads(tunnel.stdout)["sni"] == "api.example.com", tunnel.stderr
    plain = curl("--proxy", internet.upstream_proxy, "-i", "http://example.com/_echo")
    assert "connection: close" in plain.stdout.lower()
    assert json.loads(plain.stdout.split("\n\n", 1)[1])["headers"]["Connection"] == "close"
    nowhere = curl("--proxy", internet.upstream_proxy, "https://no.such.name/")
    assert nowhere.returncode != 0
    logged = [(r["method"], r["target"], r["address"], r["status"]) for r in internet.proxy_requests()]
    assert logged == [
        ("CONNECT", "api.example.com:443", internet.hosts["api.example.com"], 200),
        ("GET", "http://example.com/_echo", internet.hosts["example.com"], 200),
        ("CONNECT", "no.such.name:443", None, 502),
    ]
    assert internet.requests("api.example.com")[-1]["client"] == internet.addresses[0]  # the proxy's side


def test_pip_installs_a_published_wheel_through_the_upstream_proxy(internet: TestInternet, tmp_path: Path) -> None:
    source = "def main():\n    print('hello from sg-hello')\n"
    wheel = publish_wheel(internet, "SG.Hello", "1.0", source, console_script=("sg-hello", "sg_hello:main"))
    target = tmp_path / "target"
    # requests lets these two override pip's --cert, and --isolated does not drop them
    env = {k: v for k, v in os.environ.items() if k not in ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE")}
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--isolated", "--no-cache-dir", "--disable-pip-version-check",
         "--index-url", "https://pypi.org/simple", "--cert", str(internet.ca.cert_path),
         "--proxy", internet.upstream_proxy, "--target", str(target), "sg-hello"],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert (target / "sg_hello.py").read_text() == source
    assert (target / "bin" / "sg-hello").exists()
    assert [r["path"] for r in internet.requests("files.pythonhosted.org")] == [f"/packages/{wheel.name}"]
    assert "/simple/sg-hello/" in [r["path"] for r in internet.requests("pypi.org")]


def test_installer_runs_through_the_upstream_proxy(internet: TestInternet, tmp_path: Path) -> None:
    url = publish_installer(internet, path="/uv/0.9.5/install.sh")
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "HTTPS_PROXY": internet.upstream_proxy,
           "CURL_CA_BUNDLE": str(internet.ca.cert_path)}  # fmt: skip
    script = f"curl -LsSf {url} | sh && . $HOME/.local/bin/env && sgtool"
    done = subprocess.run(["sh", "-c", script], capture_output=True, text=True, env=env, timeout=30)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "sgtool ok"
    assert [r["path"] for r in internet.requests("astral.sh")][-2:] == ["/uv/0.9.5/install.sh", "/tool.tar.gz"]


def test_teardown_leaves_nothing_even_when_the_test_fails(tmp_path: Path) -> None:
    reason = namespaces_usable()
    if reason is not None:
        skip_missing(reason)
    try:
        with pytest.raises(KeyError), open_internet(tmp_path) as net:
            assert net.namespace in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
            raise KeyError("a failing test")
    except NamespaceUnavailable as exc:
        skip_missing(f"cannot make a network namespace here: {exc}")
    assert net.namespace not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-j", "link"], capture_output=True, text=True).stdout
    assert net.host_link not in {link["ifname"] for link in json.loads(links)}
    assert net.namespace.removeprefix("sgnet-") not in links
