"""A Terminal-Bench-2-style task over real images, for the task-image tests of every backend.

The task's Dockerfile starts ``FROM`` a Debian image (built from Debian packages, served by a
real registry on 127.0.0.1), copies a tool out of another image (``COPY --from``), installs a
package with ``apt-get install`` from an apt repository the tests serve, asks for 4G of memory,
and its reference solution is a 70 KB ``solve.sh``. Test modules load the fixtures with
``pytest_plugins = ["tests.support.fixtures.oci_fixtures", "tests.support.targets.tb2_images"]``. PYTEST_DONT_REWRITE.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import textwrap
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from pool import LocalBackend, available_backends
from pool.build.registry.settings import RegistrySettings
from tests.support.fixtures.oci_fixtures import (
    DebianImages,
    Entry,
    Layout,
    Registry,
    free_port,
    new_image,
    push,
    write_tar,
)

PACKAGE = "snapgym-hello"
ANSWER_LINES = 2000  # about 70 KB of solve.sh: more than the default 64 KiB action limit
FILES_DIGEST = (
    "cd / && find usr/bin/uv usr/bin/snapgym-hello app etc/apt/sources.list -xdev "
    "\\( -type f -o -type l \\) -print0 | sort -z | xargs -0 sha256sum | sha256sum"
)


@dataclass(frozen=True)
class TaskImages:
    """What the task needs: its base image, the tool image and the apt repository."""

    base: str
    tool: str
    apt_url: str
    registry: str


def _build_network_address() -> str:
    """Where build steps on every backend reach a server of the test: the Docker bridge's gateway
    when an engine runs (the engine's builder gives RUN steps the bridge network), else this
    machine's first address that is not loopback. Either is a private address, which the local
    backend's builds reach through the egress proxy only because the tests trust it."""
    if available_backends()["docker"] is not None:
        import socket

        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect(("10.255.255.255", 9))  # no packet is sent: this only picks the source address
            return str(probe.getsockname()[0])
    import docker

    client = docker.from_env()
    try:
        config = client.networks.get("bridge").attrs["IPAM"]["Config"][0]
    finally:
        client.close()
    if "Gateway" in config:
        return str(config["Gateway"])
    import ipaddress  # some engines (Debian's 20.10) leave the default bridge's gateway out: its subnet's first host

    return str(next(ipaddress.ip_network(config["Subnet"]).hosts()))


@pytest.fixture(scope="module")
def apt_repository(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A flat apt repository holding one package, served over HTTP where every backend's builds reach it."""
    folder = tmp_path_factory.mktemp("apt")
    root = folder / "pkg"
    (root / "DEBIAN").mkdir(parents=True)
    (root / "DEBIAN" / "control").write_text(
        f"Package: {PACKAGE}\nVersion: 1.0\nArchitecture: all\nMaintainer: snapgym tests <tests@snapgym.invalid>\n"
        "Description: a package from the tests' own apt repository\n"
    )
    (root / "usr" / "bin").mkdir(parents=True)
    tool = root / "usr" / "bin" / PACKAGE
    tool.write_text("#!/bin/sh\necho hello from a Debian package\n")
    tool.chmod(0o755)
    repo = folder / "repo"
    repo.mkdir()
    subprocess.run(["dpkg-deb", "--root-owner-group", "--build", root, repo / f"{PACKAGE}_1.0_all.deb"],
                   check=True, capture_output=True)  # fmt: skip
    index = subprocess.run(["dpkg-scanpackages", "."], cwd=repo, check=True, capture_output=True, text=True).stdout
    (repo / "Packages").write_text(index)
    port, address = free_port(), _build_network_address()
    server = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(port), "--bind", address, "--directory", str(repo)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        yield f"http://{address}:{port}"
    finally:
        server.terminate()
        server.wait(timeout=10)


@pytest.fixture(scope="module")
def task_images(
    debian_images: DebianImages, registry: Registry, apt_repository: str, tmp_path_factory: pytest.TempPathFactory
) -> TaskImages:
    """The Debian base and a one-file tool image (like ghcr.io/astral-sh/uv), in the registry."""
    folder = tmp_path_factory.mktemp("tool-image")
    layer = write_tar(folder / "tool.tar", [Entry("uv", b"#!/bin/sh\necho uv 0.0-test\n", mode=0o755)])
    layout = Layout(folder / "layout")
    new_image(layout, "0.1", [layer], env={"PATH": "/"})
    tool = push(layout.ref("0.1"), registry, "test/uv:0.1")
    return TaskImages(base=debian_images.base, tool=tool, apt_url=apt_repository, registry=registry.host)


def _answer() -> str:
    return "".join(f"line {i:05d}: {hashlib.sha256(str(i).encode()).hexdigest()}\n" for i in range(ANSWER_LINES))


def write_tb2_task(root: Path, images: TaskImages) -> Path:
    """A task directory in the Harbor / Terminal-Bench 2 layout over ``images``."""
    task = root / "tb2-style"
    for folder in ("environment", "tests", "solution"):
        (task / folder).mkdir(parents=True)
    (task / "instruction.md").write_text("Write the answer to /app/answer.txt.\n")
    (task / "task.toml").write_text(
        textwrap.dedent("""\
        version = "1.0"
        [agent]
        timeout_sec = 600
        [verifier]
        timeout_sec = 120
        [environment]
        build_timeout_sec = 600
        memory = "4G"
        cpus = 1
        """)
    )
    (task / "environment" / "Dockerfile").write_text(
        textwrap.dedent(f"""\
        FROM {images.base}
        COPY --from={images.tool} /uv /bin/
        RUN rm -f /etc/apt/sources.list.d/* \\
            && echo "deb [trusted=yes] {images.apt_url} ./" > /etc/apt/sources.list \\
            && apt-get update && apt-get install -y --no-install-recommends {PACKAGE} \\
            && rm -rf /var/lib/apt/lists/*
        WORKDIR /app
        COPY notes.txt /app/notes.txt
        """)
    )
    (task / "environment" / "notes.txt").write_text("the answer goes to /app/answer.txt\n")
    expected = hashlib.sha256((_answer() + "hello from a Debian package\nuv 0.0-test\n").encode()).hexdigest()
    (task / "tests" / "test.sh").write_text(
        textwrap.dedent(f"""\
        #!/bin/bash
        mkdir -p /logs/verifier
        got=$(sha256sum /app/answer.txt 2>/dev/null | cut -d' ' -f1)
        if [ "$got" = "{expected}" ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt
        """)
    )
    solve = f"#!/bin/bash\nset -e\ncat > /app/answer.txt <<'EOF'\n{_answer()}EOF\n{PACKAGE} >> /app/answer.txt\n"
    solve += "uv >> /app/answer.txt\n"
    (task / "solution" / "solve.sh").write_text(solve)
    assert len(solve.encode()) > 64 * 1024
    return task


@pytest.fixture(scope="module")
def image_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One local store for the module: the Debian layer is unpacked once."""
    return tmp_path_factory.mktemp("tb2-store")


def local_backend(images: TaskImages, store: Path) -> LocalBackend:
    """The local backend, reaching the test registry (plain HTTP) and, through its egress proxy, the
    apt repository on a private address (trusted here: a build's public network is the internet)."""
    apt_host = urllib.parse.urlsplit(images.apt_url).hostname
    return LocalBackend(
        store_dir=store,
        registry=RegistrySettings(insecure_registries=[images.registry]),
        egress={"trusted_networks": [f"{apt_host}/32"]},
    )
