"""A fake internet for the egress tests: origin servers in a network namespace, reached over a veth pair.

:func:`open_internet` makes a namespace ``sgnet-<random>`` joined to this one
by a veth pair on ``10.231.N.0/24`` (N picked free of this machine's routes):
``.1`` is this side, ``.2``, ``.3`` and ``.4`` are the namespace's, where
``internet_server.py`` serves HTTP(S) virtual hosts, a TCP echo, a UDP sink
and an upstream-proxy stand-in, and logs whatever reaches it. Nothing there
routes anywhere else, so no test traffic can reach a real address.

Test modules load it with ``pytest_plugins = ["tests.support.net_fixtures"]`` (which gives
them the module-scoped ``internet`` fixture) and import its helpers. It has no
asserts of its own (PYTEST_DONT_REWRITE: test modules import it before pytest
could rewrite it).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import ipaddress
import json
import os
import random
import re
import secrets
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile
from base64 import urlsafe_b64encode
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pool import Backend, load_backend
from tests.support.backends import BACKEND_OPTIONS, LIMITS
from tests.support.needs import skip_missing
from tests.support.testca import TestCA

SERVER = Path(__file__).with_name("internet_server.py")
PREFIX = "10.231"
LOCK_FILE = Path("/tmp/snapgym-test-internet.lock")
"""Held while a namespace picks its subnet, so two test runs at once never pick the same one."""
DEFAULT_NAMES: dict[str, int] = {
    "astral.sh": 2,
    "pypi.org": 2,
    "files.pythonhosted.org": 2,
    "example.com": 2,
    "api.example.com": 2,
    "github.com": 2,
    "other.test": 3,
}
"""Name -> last octet of its address in the namespace."""
HOST_OCTETS = (2, 3, 4)
PROXY_PORT = 3129
START_TIMEOUT_S = 20.0


@dataclass(frozen=True, slots=True)
class TestInternet:
    """A running fake internet; its logs are read fresh on every call."""

    __test__ = False  # not a pytest test class

    namespace: str
    """The network namespace's name (``sgnet-...``)."""
    network: str
    """The veth subnet, ``10.231.N.0/24``."""
    host_link: str
    """This namespace's end of the veth pair (``sgh-...``)."""
    host_address: str
    """This namespace's end of the veth pair (``10.231.N.1``): where requests to the origins come from."""
    addresses: list[str]
    """The namespace's addresses (``.2``, ``.3``, ``.4``); every one serves everything."""
    hosts: dict[str, str]
    """Name -> address of every virtual host (the egress proxy's ``hosts`` map)."""
    ca: TestCA
    """The CA that signed the origins' certificate (one certificate for all names and addresses)."""
    root: Path
    """The folder holding the sites, logs and certificates."""
    upstream_proxy: str
    """``http://10.231.N.2:3129``: the corporate upstream proxy stand-in."""

    def site(self, name: str) -> Path:
        """The static folder of a virtual host; the server reads it at request time."""
        return self.root / "sites" / name.lower()

    def url(self, name: str, path: str = "/", tls: bool = True) -> str:
        """``https://name/path`` (or ``http://``)."""
        return f"{'https' if tls else 'http'}://{name}/{path.lstrip('/')}"

    def requests(self, name: str | None = None) -> list[dict[str, Any]]:
        """The origins' request log (oldest first), optionally only the requests for one Host."""
        records = self._log("requests")
        return records if name is None else [r for r in records if r.get("host") == name.lower()]

    def proxy_requests(self) -> list[dict[str, Any]]:
        """What the upstream proxy stand-in relayed (or refused with 502)."""
        return self._log("proxy")

    def udp_datagrams(self) -> list[dict[str, Any]]:
        """Every UDP datagram that reached a namespace address (``data`` is hex)."""
        return self._log("udp")

    def tcp_connections(self) -> list[dict[str, Any]]:
        """Every connection the TCP echo accepted."""
        return self._log("tcp")

    def log_path(self, kind: str) -> Path:
        """The JSON-lines file of ``requests``, ``proxy``, ``tcp`` or ``udp``."""
        return self.root / "logs" / f"{kind}.jsonl"

    def _log(self, kind: str) -> list[dict[str, Any]]:
        path = self.log_path(kind)
        if not path.exists():
            return []
        records = []
        for line in path.read_text().splitlines():
            with contextlib.suppress(ValueError):  # a line still being written
                records.append(json.loads(line))
        return records


class NamespaceUnavailable(RuntimeError):
    """This machine cannot make a network namespace (not root, no iproute2, no permission)."""


def namespaces_usable() -> str | None:
    """Why network namespaces cannot be made here, or None."""
    if os.geteuid() != 0:
        return "making network namespaces needs root"
    if shutil.which("ip") is None:
        return "iproute2's ip is not installed"
    return None


@contextlib.contextmanager
def open_internet(folder: Path, *, extra_names: Mapping[str, int] | None = None) -> Iterator[TestInternet]:
    """Make the namespace, veth pair and servers; remove all of them on exit, whatever happened.

    Args:
        folder: An empty folder for the sites, logs and certificates.
        extra_names: More virtual hosts, name -> last octet of their address (2, 3 or 4).
    """
    names = {**DEFAULT_NAMES, **{k.lower(): v for k, v in (extra_names or {}).items()}}
    suffix = secrets.token_hex(3)
    namespace, host_link, ns_link = f"sgnet-{suffix}", f"sgh-{suffix}", f"sgn-{suffix}"
    server: subprocess.Popen[bytes] | None = None
    try:
        network = _make_network(namespace, host_link, ns_link)
        base = network.rsplit(".", 1)[0]
        internet = TestInternet(
            namespace=namespace,
            network=network,
            host_link=host_link,
            host_address=f"{base}.1",
            addresses=[f"{base}.{octet}" for octet in HOST_OCTETS],
            hosts={name: f"{base}.{octet}" for name, octet in names.items()},
            ca=TestCA(folder / "ca"),
            root=folder,
            upstream_proxy=f"http://{base}.2:{PROXY_PORT}",
        )
        server = _start_server(internet)
        yield internet
    finally:
        if server is not None:
            stop_server(server)
        _remove_network(namespace, host_link)


def _make_network(namespace: str, host_link: str, ns_link: str) -> str:
    """Create the namespace and veth pair on a free 10.231.N.0/24; return that CIDR."""
    try:
        _ip("netns", "add", namespace)
    except RuntimeError as exc:
        raise NamespaceUnavailable(str(exc)) from None
    _ip("link", "add", host_link, "type", "veth", "peer", "name", ns_link, "netns", namespace)
    LOCK_FILE.touch(exist_ok=True)
    with LOCK_FILE.open() as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        base = _free_subnet()
        _ip("addr", "add", f"{base}.1/24", "dev", host_link)
    for octet in HOST_OCTETS:
        _ip("-n", namespace, "addr", "add", f"{base}.{octet}/24", "dev", ns_link)
    _ip("-n", namespace, "link", "set", "lo", "up")
    _ip("-n", namespace, "link", "set", ns_link, "up")
    _ip("link", "set", host_link, "up")
    return f"{base}.0/24"


def _free_subnet() -> str:
    """``10.231.N`` for an N whose /24 overlaps no route of this namespace (the default route aside)."""
    routes = json.loads(_ip("-j", "route", "show", "table", "all"))
    taken = []
    for route in routes:
        with contextlib.suppress(ValueError):
            if route.get("dst") not in (None, "default"):
                taken.append(ipaddress.ip_network(route["dst"], strict=False))
    free = []
    for n in range(256):
        candidate = ipaddress.ip_network(f"{PREFIX}.{n}.0/24")
        if not any(candidate.version == t.version and candidate.overlaps(t) for t in taken):
            free.append(n)
    if not free:
        raise RuntimeError(f"no free /24 in {PREFIX}.0.0/16 for a test internet")
    return f"{PREFIX}.{random.choice(free)}"


def _start_server(internet: TestInternet) -> subprocess.Popen[bytes]:
    """Start internet_server.py in the namespace and wait until it has bound every listener."""
    root = internet.root
    (root / "logs").mkdir(parents=True, exist_ok=True)
    for name in internet.hosts:
        internet.site(name).mkdir(parents=True, exist_ok=True)
    issued = internet.ca.issue([*internet.hosts, *internet.addresses], stem="origins")
    ready = root / "server.ready"
    config = {
        "addresses": internet.addresses,
        "sites": {name: str(internet.site(name)) for name in internet.hosts},
        "hosts": internet.hosts,
        "cert": str(issued.cert_path),
        "key": str(issued.key_path),
        "logs": {kind: str(internet.log_path(kind)) for kind in ("requests", "proxy", "tcp", "udp")},
        "proxy_port": PROXY_PORT,
        "ready_file": str(ready),
    }
    (root / "server.json").write_text(json.dumps(config, indent=1))
    stderr = root / "server.log"
    with stderr.open("wb") as err:
        server = subprocess.Popen(
            ["ip", "netns", "exec", internet.namespace, sys.executable, str(SERVER), str(root / "server.json")],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
        )  # fmt: skip
    deadline = time.monotonic() + START_TIMEOUT_S
    while not ready.exists():
        if server.poll() is not None or time.monotonic() > deadline:
            stop_server(server)
            raise RuntimeError(f"the test internet's server did not start: {stderr.read_text()[-2000:]}")
        time.sleep(0.05)
    return server


def stop_server(server: subprocess.Popen[bytes]) -> None:
    """Terminate a server process, killing it if it has not stopped within 5 s."""
    server.terminate()
    try:
        server.wait(timeout=5)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()


def _remove_network(namespace: str, host_link: str) -> None:
    """Kill what is left in the namespace, then delete the veth pair and the namespace (each may be gone)."""
    pids = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True, text=True).stdout.split()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), 9)
    # Deleting our end removes the pair at once; the namespace's end would go with it only later.
    subprocess.run(["ip", "link", "del", host_link], capture_output=True)
    subprocess.run(["ip", "netns", "del", namespace], capture_output=True)


def _ip(*args: str) -> str:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


def wait_until(check: Callable[[], Any], timeout_s: float = 5.0) -> Any:
    """Poll ``check`` until it returns something truthy and return that (the last falsy value on timeout)."""
    deadline = time.monotonic() + timeout_s
    while not (result := check()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return result


# ---------------------------------------------------------------- a package index


def normalise(project: str) -> str:
    """PEP 503's normalised project name."""
    return re.sub(r"[-_.]+", "-", project).lower()


def publish_wheel(
    internet: TestInternet,
    project: str,
    version: str,
    module_source: str,
    console_script: tuple[str, str] | None = None,
) -> Path:
    """Build a pure-Python wheel into files.pythonhosted.org and list it in pypi.org's simple index.

    The wheel holds one module named after the project (``my-tool`` -> ``my_tool.py``).

    Args:
        console_script: ``(command, "module:function")`` for an ``entry_points.txt``.

    Returns:
        The wheel file (under ``https://files.pythonhosted.org/packages/``).
    """
    dist = re.sub(r"[-_.]+", "_", project).lower()
    files: dict[str, bytes] = {f"{dist}.py": module_source.encode()}
    info = f"{dist}-{version}.dist-info"
    files[f"{info}/METADATA"] = f"Metadata-Version: 2.1\nName: {project}\nVersion: {version}\n".encode()
    files[f"{info}/WHEEL"] = b"Wheel-Version: 1.0\nGenerator: snapgym-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    if console_script is not None:
        files[f"{info}/entry_points.txt"] = f"[console_scripts]\n{console_script[0]} = {console_script[1]}\n".encode()
    record = [f"{path},sha256={_b64_digest(data)},{len(data)}" for path, data in files.items()]
    files[f"{info}/RECORD"] = ("\n".join([*record, f"{info}/RECORD,,"]) + "\n").encode()
    packages = internet.site("files.pythonhosted.org") / "packages"
    packages.mkdir(parents=True, exist_ok=True)
    wheel = packages / f"{dist}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as archive:
        for path, data in files.items():
            archive.writestr(path, data)
    _write_simple_index(internet, project)
    return wheel


def _b64_digest(data: bytes) -> str:
    return urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _write_simple_index(internet: TestInternet, project: str) -> None:
    """Rewrite ``/simple/<project>/`` (every wheel of it published so far) and ``/simple/``."""
    dist = re.sub(r"[-_.]+", "_", project).lower()
    packages = internet.site("files.pythonhosted.org") / "packages"
    links = []
    for wheel in sorted(packages.glob(f"{dist}-*.whl")):
        digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
        url = f"https://files.pythonhosted.org/packages/{wheel.name}#sha256={digest}"
        links.append(f'<a href="{url}">{wheel.name}</a><br>')
    simple = internet.site("pypi.org") / "simple"
    _write_page(simple / normalise(project) / "index.html", f"Links for {project}", links)
    projects = sorted(p.name for p in simple.iterdir() if p.is_dir())
    _write_page(simple / "index.html", "Simple index", [f'<a href="/simple/{p}/">{p}</a><br>' for p in projects])


def _write_page(path: Path, title: str, lines: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    body = "\n".join(lines)
    path.write_text(f"<!DOCTYPE html>\n<html><head><title>{title}</title></head><body>\n{body}\n</body></html>\n")


# ---------------------------------------------------------------- an installer like astral's


INSTALLER = """\
#!/bin/sh
# A stand-in for astral's uv installer: fetch a tarball with curl, install into $HOME/.local/bin,
# write $HOME/.local/bin/env. curl finds its proxy and CA bundle in the environment.
set -eu
dest="$HOME/.local/bin"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "downloading sgtool"
curl -LsSf "https://astral.sh/tool.tar.gz" -o "$tmp/tool.tar.gz"
tar -xzf "$tmp/tool.tar.gz" -C "$tmp"
mkdir -p "$dest"
cp "$tmp/sgtool" "$dest/sgtool"
chmod 755 "$dest/sgtool"
cat > "$dest/env" <<'EOF'
#!/bin/sh
# add binaries to PATH if they aren't added yet
case ":${PATH}:" in
    *:"$HOME/.local/bin":*)
        ;;
    *)
        export PATH="$HOME/.local/bin:$PATH"
        ;;
esac
EOF
echo "installing to $dest"
echo "everything's installed!"
"""
TOOL = b'#!/bin/sh\necho "sgtool ok"\n'


def publish_installer(internet: TestInternet, *, path: str = "/install.sh") -> str:
    """Publish ``https://astral.sh<path>`` (a uv-installer-shaped script) and the ``tool.tar.gz`` it fetches.

    The installed ``sgtool`` prints ``sgtool ok``. Pass ``path="/uv/0.9.5/install.sh"`` for the
    URL that TB2 test scripts fetch.

    Returns:
        The installer's URL.
    """
    site = internet.site("astral.sh")
    script = site / path.lstrip("/")
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text(INSTALLER)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        entry = tarfile.TarInfo("sgtool")
        entry.size, entry.mode, entry.mtime = len(TOOL), 0o755, int(time.time())
        tar.addfile(entry, io.BytesIO(TOOL))
    (site / "tool.tar.gz").write_bytes(buffer.getvalue())
    return internet.url("astral.sh", path)


# ---------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def internet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestInternet]:
    """A fake internet for the module's tests (skipped where network namespaces cannot be made)."""
    reason = namespaces_usable()
    if reason is not None:
        skip_missing(reason)
    with contextlib.ExitStack() as stack:
        try:
            net = stack.enter_context(open_internet(tmp_path_factory.mktemp("internet")))
        except NamespaceUnavailable as exc:
            skip_missing(f"cannot make a network namespace here: {exc}")
        yield net


def egress_options(internet: TestInternet, **overrides: Any) -> dict[str, Any]:
    """Egress settings that reach the test internet and trust its CA."""
    return {
        "hosts": dict(internet.hosts),
        "trusted_networks": [internet.network],
        "extra_ca_files": [str(internet.ca.cert_path)],
        **overrides,
    }


@contextlib.contextmanager
def proxied_backend(name: str, store: Path, egress: Mapping[str, Any]) -> Iterator[Backend]:
    """:func:`open_backend`, closed on exit; the test is skipped where the backend has no egress proxy."""
    backend = open_backend(name, store, egress)
    try:
        if backend.capabilities.egress_control != "proxy":
            skip_missing(f"the {name} backend has no egress proxy here")
        yield backend
    finally:
        backend.close()


def open_backend(name: str, store: Path, egress: Mapping[str, Any]) -> Backend:
    """A backend by name with the tests' limits and these egress settings (``store``: the local one's)."""
    options: dict[str, Any] = {**LIMITS, **BACKEND_OPTIONS.get(name, {}), "egress": dict(egress)}
    if name == "local":
        options["store_dir"] = store
    return load_backend(name, **options)
