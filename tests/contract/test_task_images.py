"""A Terminal-Bench-2-style task runs from its own image, as it would in Harbor, on every backend.

The task's Dockerfile starts ``FROM`` a Debian image (built from Debian packages, served by a
real registry on 127.0.0.1), copies a tool out of another image (``COPY --from``), installs a
package with ``apt-get install`` from an apt repository the test serves, asks for 4G of memory,
and its reference solution is a 70 KB ``solve.sh``. The reference solution must score 1.0 and
doing nothing 0.0, on the local backend (no Docker engine: skopeo and overlayfs) and on the
Docker backend (the engine's own builder); and the two start states hold the same files.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import tarfile
import textwrap
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import envs
from pool import Backend, LocalBackend, available_backends, load_backend
from pool.build.registry.settings import RegistrySettings
from tests.support.backends import backend_params, need_backend
from tests.support.needs import needs
from tests.support.oci_fixtures import (
    DebianImages,
    Entry,
    Layout,
    Registry,
    free_port,
    missing_tools,
    new_image,
    push,
    write_tar,
)

pytest_plugins = ["tests.support.oci_fixtures"]

pytestmark = needs(missing_tools(), f"needs {', '.join(missing_tools())}")

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


@pytest.fixture(scope="module", params=backend_params())
def image_backend(request: pytest.FixtureRequest, task_images: TaskImages, image_store: Path) -> Iterator[Backend]:
    """Each backend, able to reach the test registry (plain HTTP on 127.0.0.1)."""
    if request.param == "local":
        backend: Backend = local_backend(task_images, image_store)
    else:
        backend = load_backend(str(request.param))
    try:
        yield backend
    finally:
        backend.close()


def test_a_tb2_style_task_scores_oracle_one_and_noop_zero(
    image_backend: Backend, task_images: TaskImages, tmp_path: Path
) -> None:
    """FROM <image>, COPY --from=<image>, RUN apt-get install, memory = "4G" and a 70 KB solve.sh."""
    task = envs.load_task(write_tb2_task(tmp_path, task_images))
    check = envs.check_task(image_backend, task)
    assert (check.oracle.reward, check.noop.reward) == (1.0, 0.0), (check.oracle.output[-2000:], check.noop)
    snapshot = image_backend.build(task.template)
    assert snapshot.resources.memory_mb == 4096
    apt = urllib.parse.urlsplit(task_images.apt_url).netloc
    if image_backend.name == "local":  # RUN apt-get went through the egress proxy, on record
        assert snapshot.build_network["route"] == "proxy", snapshot.build_network
        assert apt in snapshot.build_network["audit"]["hosts"]["allowed"], snapshot.build_network
    else:  # the engine's builder gave RUN the bridge: not filtered, and the record says so
        assert snapshot.build_network["builder_route"] == "direct", snapshot.build_network
    assert snapshot.workdir == "/app"
    with image_backend.create(snapshot) as sandbox:
        r = sandbox.exec(f"{PACKAGE}; uv; cat /etc/debian_version; id -u; pwd")
        assert r.stdout.startswith("hello from a Debian package\nuv 0.0-test\n12."), r
        assert r.stdout.endswith("0\n/app\n")


def test_the_same_image_gives_the_same_files_on_every_backend(
    task_images: TaskImages, tmp_path: Path, image_store: Path
) -> None:
    """The start state built from the task's image holds the same files on the local and the Docker backend."""
    need_backend("docker")
    task = envs.load_task(write_tb2_task(tmp_path, task_images))
    digests = {}
    local = local_backend(task_images, image_store)
    docker = load_backend("docker")
    try:
        for name, backend in (("local", local), ("docker", docker)):
            with backend.create(backend.build(task.template)) as sandbox:
                result = sandbox.exec(FILES_DIGEST)
                assert result.ok, result
                digests[name] = result.stdout
    finally:
        local.close()
        docker.close()
    assert digests["local"] == digests["docker"]


def test_a_missing_image_fails_the_build_and_says_how_to_provide_it(
    task_images: TaskImages, tmp_path: Path, image_store: Path
) -> None:
    """An image the registry does not have is an ImageError naming it and the ways to provide it."""
    task_dir = write_tb2_task(tmp_path, task_images)
    dockerfile = task_dir / "environment" / "Dockerfile"
    dockerfile.write_text(dockerfile.read_text().replace(task_images.base, f"{task_images.registry}/test/nope:1"))
    task = envs.load_task(task_dir)
    with (
        local_backend(task_images, image_store) as backend,
        pytest.raises(envs.errors.ConfigError) as raised,
    ):
        backend.build(task.template)
    message = str(raised.value)
    assert "test/nope:1" in message and ("docker-archive" in message or "credentials" in message), message


def test_a_tarball_of_the_image_is_another_source(task_images: TaskImages, tmp_path: Path, image_store: Path) -> None:
    """bases={image: "docker-archive:..."} builds the same task from a `docker save`-style archive, offline."""
    archive = tmp_path / "debian.tar"
    subprocess.run(
        ["skopeo", "--insecure-policy", "copy", "--quiet", "--src-tls-verify=false",
         f"docker://{task_images.base}", f"docker-archive:{archive}:debian:bookworm"],
        check=True, capture_output=True,
    )  # fmt: skip
    assert tarfile.is_tarfile(archive)
    task_dir = write_tb2_task(tmp_path, task_images)
    task = envs.load_task(task_dir, bases={task_images.base: f"docker-archive:{archive}"})
    with local_backend(task_images, image_store) as backend:
        check = envs.check_task(backend, task)
    assert (check.oracle.reward, check.noop.reward) == (1.0, 0.0)


@pytest.mark.parametrize(
    ("prebuilt", "prefer", "from_dockerfile"),
    [("sibling", True, False), ("sibling", False, True), ("missing", True, True)],
    ids=["prebuilt-used", "prebuilt-not-preferred", "prebuilt-missing"],
)
def test_a_prebuilt_docker_image_is_used_when_it_can_be_had(
    debian_images: DebianImages,
    registry: Registry,
    tmp_path: Path,
    image_store: Path,
    prebuilt: str,
    prefer: bool,
    from_dockerfile: bool,
) -> None:
    """task.toml docker_image replaces the Dockerfile when the backend can get it and prefers prebuilt images."""
    image = debian_images.sibling if prebuilt == "sibling" else f"{registry.host}/test/missing:1"
    task_dir = tmp_path / "prebuilt"
    for folder in ("environment", "tests"):
        (task_dir / folder).mkdir(parents=True)
    (task_dir / "instruction.md").write_text("Nothing to do.\n")
    (task_dir / "task.toml").write_text(f'version = "1.0"\n[environment]\ndocker_image = "{image}"\n')
    (task_dir / "tests" / "test.sh").write_text("#!/bin/sh\necho 1 > /logs/verifier/reward.txt\n")
    (task_dir / "environment" / "Dockerfile").write_text(
        f"FROM {debian_images.base}\nRUN echo from-the-dockerfile > /marker\nWORKDIR /app\n"
    )
    settings = RegistrySettings(insecure_registries=[registry.host])
    with LocalBackend(store_dir=image_store, registry=settings, prefer_prebuilt=prefer) as backend:
        snapshot = backend.build(envs.load_task(task_dir).template)
        with backend.create(snapshot) as sandbox:
            marker = sandbox.exec("cat /marker 2>/dev/null || echo none").stdout.strip()
    assert marker == ("from-the-dockerfile" if from_dockerfile else "none")
