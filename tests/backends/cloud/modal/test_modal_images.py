"""Task images and resources on Modal: the real ``modal`` SDK's ``Image.from_registry`` against the
stand-in's image builder, which pulls the image for real (a Debian image built from Debian packages,
served by a registry on 127.0.0.1) into a local template its sandboxes run from.

A sandbox created from a ``ProviderImage`` sees the image's files; a second create of the same
image builds nothing; an image the registry does not have is an ``ImageError`` naming it; registry
credentials travel in Modal's registry secret and never reach a sandbox's environment; CPUs, memory
and GPUs reach the create's definition (V1 for GPUs, with the image).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import modal
import pytest

from pool import LocalBackend, Resources, Template
from pool.backends.modal import ModalBackend
from pool.backends.remote.provider import CreateRequest, ProviderImage
from pool.build.registry.settings import RegistrySettings
from pool.errors import ImageError
from tests.backends.cloud.modal.standin import ModalStandin
from tests.support.fixtures.oci_fixtures import DebianImages, Registry, missing_tools
from tests.support.needs import needs

pytest_plugins = ["tests.support.fixtures.oci_fixtures"]
pytestmark = needs(missing_tools(), f"needs {', '.join(missing_tools())}")

USER, PASSWORD = "robot", "s3cret-registry-token"


@pytest.fixture(scope="module")
def registry_local(registry: Registry, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalBackend]:
    """The stand-in's local backend, reaching the plain-HTTP test registry."""
    settings = RegistrySettings(insecure_registries=[registry.host])
    with LocalBackend(store_dir=tmp_path_factory.mktemp("modal-images"), registry=settings) as local:
        yield local


@pytest.fixture
def standin(registry_local: LocalBackend) -> Iterator[ModalStandin]:
    with ModalStandin(registry_local) as standin:
        yield standin


def options(standin: ModalStandin, registry_file: Path) -> dict[str, object]:
    host = standin.backend.registry.insecure_registries[0]  # the test registry, read on the host too
    return {"token_id": standin.token_id, "token_secret": standin.token_secret, "server_url": standin.url,
            "base_image": standin.base_image_id, "registry_file": str(registry_file),
            "registry": {"insecure_registries": [host]}}  # fmt: skip


@pytest.fixture
def backend(standin: ModalStandin, tmp_path: Path) -> Iterator[ModalBackend]:
    with ModalBackend(**options(standin, tmp_path / "images.json")) as modal_backend:  # type: ignore[arg-type]
        yield modal_backend


def request(image: ProviderImage, resources: Resources | None = None) -> CreateRequest:
    return CreateRequest(None, {"snapgym.role": "build"}, idempotency_key=image.key + "x", image=image,
                         resources=resources)  # fmt: skip


def rpcs(standin: ModalStandin, name: str) -> list[str]:
    return [r.status for r in standin.requests if r.rpc == name]


def test_a_sandbox_from_a_registry_image_sees_its_files_and_a_second_create_builds_nothing(
    standin: ModalStandin, backend: ModalBackend, debian_images: DebianImages
) -> None:
    image = ProviderImage(debian_images.base, insecure=True)
    provider = backend.provider
    first = provider.create(request(image))
    seen = provider.run(first, "cat /etc/debian_version; ls /srv; echo $SNAPGYM_IMAGE", cwd="/", env={},
                        timeout_s=30, cap=4096)  # fmt: skip
    assert seen.exit_code == 0 and seen.stdout.startswith("12."), seen
    assert seen.stdout.splitlines()[-1] == "debian"  # the image's ENV
    (build,) = standin.builds.records()
    assert build.reference == debian_images.base and build.registry_username is None
    record = standin.sandboxes()[provider.sandbox_id(first)]
    assert record.image_id == build.image_id and standin.images()[build.image_id].kind == "registry"
    provider.kill(first)
    second = provider.create(request(image))
    assert provider.run(second, "cat /etc/debian_version", cwd="/", env={}, timeout_s=30, cap=64).stdout.startswith(
        "12."
    )
    assert len(standin.builds.records()) == 1  # Modal's image, found again: nothing built
    assert standin.sandboxes()[provider.sandbox_id(second)].image_id == build.image_id
    assert rpcs(standin, "ImageJoinStreaming") == ["OK"] and rpcs(standin, "ImageFromId") == ["OK"]
    provider.kill(second)


def test_another_machine_finds_modals_image_by_its_definition_and_an_expired_one_is_built_again(
    standin: ModalStandin, backend: ModalBackend, debian_images: DebianImages, tmp_path: Path
) -> None:
    image = ProviderImage(debian_images.base, insecure=True)
    backend.provider.kill(backend.provider.create(request(image)))
    (build,) = standin.builds.records()
    elsewhere = options(standin, tmp_path / "elsewhere.json")  # no registry file entry: asks Modal
    with ModalBackend(**elsewhere) as other:  # type: ignore[arg-type]
        other.provider.kill(other.provider.create(request(image)))
        assert rpcs(standin, "ImageGetOrCreate") == ["OK", "OK"] and rpcs(standin, "ImageJoinStreaming") == ["OK"]
        assert len(standin.builds.records()) == 1  # the same definition: Modal's image, not a build
    standin.expire_image(build.image_id)
    again = backend.provider.create(request(image))  # the remembered id is gone: forgotten, built anew
    rebuilt = standin.builds.records()[-1]
    assert len(standin.builds.records()) == 2 and rebuilt.image_id != build.image_id
    assert standin.sandboxes()[backend.provider.sandbox_id(again)].image_id == rebuilt.image_id
    assert rpcs(standin, "ImageFromId") == ["NOT_FOUND"]
    backend.provider.kill(again)


def test_a_missing_image_is_an_image_error_naming_it(
    standin: ModalStandin, backend: ModalBackend, registry: Registry
) -> None:
    missing = f"{registry.host}/test/nothing-here:1"
    with pytest.raises(ImageError, match="nothing-here") as caught:
        backend.provider.create(request(ProviderImage(missing, insecure=True)))
    assert "Modal could not" in str(caught.value)
    assert standin.created_count == 0


def test_registry_credentials_travel_in_modals_registry_secret_not_in_the_sandbox(
    standin: ModalStandin, backend: ModalBackend, debian_images: DebianImages
) -> None:
    image = ProviderImage(debian_images.sibling, username=USER, password=PASSWORD, insecure=True)
    sandbox = backend.provider.create(request(image))
    env = backend.provider.run(sandbox, "env; cat /opt/sibling", cwd="/", env={}, timeout_s=30, cap=1 << 16)
    assert env.exit_code == 0 and "sibling" in env.stdout and PASSWORD not in env.stdout and USER not in env.stdout
    (build,) = standin.builds.records()
    assert build.registry_username == USER
    secret = next(r for r in standin.requests if r.rpc == "SecretGetOrCreate")
    assert secret.fields["env_dict"] == {"REGISTRY_USERNAME": USER, "REGISTRY_PASSWORD": PASSWORD}
    definition = next(r for r in standin.requests if r.rpc == "ImageGetOrCreate").fields["image"]
    assert definition["dockerfile_commands"] == [f"FROM {debian_images.sibling}"]
    assert definition["image_registry_config"]["registry_auth_type"] == "REGISTRY_AUTH_TYPE_STATIC_CREDS"
    record = standin.sandboxes()[backend.provider.sandbox_id(sandbox)]
    assert PASSWORD not in str(record.env) and PASSWORD not in str(record.definition)
    backend.provider.kill(sandbox)


def test_the_backends_registry_credentials_reach_modal_for_a_templates_image(
    standin: ModalStandin, debian_images: DebianImages, tmp_path: Path
) -> None:
    settings = options(standin, tmp_path / "images.json")
    host = debian_images.whiteouts.split("/", 1)[0]
    settings["registry"] = {
        "insecure_registries": [host],
        "credentials": {host: {"username": USER, "password": PASSWORD}},
    }
    with ModalBackend(**settings) as backend:  # type: ignore[arg-type]
        snapshot = backend.build(Template(name="modal-private", base=debian_images.whiteouts, setup=["env > /env"]))
        with backend.create(snapshot) as sandbox:
            assert PASSWORD not in sandbox.read_file("/env").decode() + sandbox.exec("env").stdout
    (build,) = standin.builds.records()
    assert build.registry_username == USER
    secrets = [r.fields["env_dict"] for r in standin.requests if r.rpc == "SecretGetOrCreate"]
    assert secrets == [{"REGISTRY_USERNAME": USER, "REGISTRY_PASSWORD": PASSWORD}]


def test_a_gpu_task_reaches_the_modal_stand_in_with_its_image_and_gpu(
    standin: ModalStandin, backend: ModalBackend, debian_images: DebianImages
) -> None:
    """The build sandbox (V1, for its GPUs) starts from Modal's build of the registry image, with the
    task's GPUs, CPUs and memory; so does each episode's sandbox, from the snapshot."""
    resources = Resources(cpus=2, memory_mb=4096, storage_mb=10240, gpus=2, gpu_types=("H100",))
    template = Template(name="modal-gpu-image", base=debian_images.base, setup=["echo gpu > /srv/kind"],
                        resources=resources)  # fmt: skip
    snapshot = backend.build(template)
    (build,) = standin.builds.records()
    assert build.reference.startswith(debian_images.base.rsplit(":", 1)[0] + "@sha256:")  # pinned on the host
    asked = {"memory_mb": 4096, "memory_mb_max": 4096, "milli_cpu": 2000, "milli_cpu_max": 2000,
             "gpu_config": {"count": 2, "gpu_type": "H100"}}  # fmt: skip
    first = next(r for r in standin.requests if r.rpc == "SandboxCreate").fields["definition"]
    assert first["image_id"] == build.image_id and first["resources"] == asked
    with backend.create(snapshot) as sandbox:
        record = standin.sandboxes()[str(sandbox.remote_id)]
        assert (record.api, record.image_id, record.gpu) == ("v1", snapshot.layers[0], "H100:2")
        assert (record.cpu, record.memory_mb) == (2.0, 4096)
        assert sandbox.exec("cat /srv/kind /etc/debian_version").stdout.startswith("gpu\n12.")
    assert "SandboxCreateV2" not in {r.rpc for r in standin.requests}
    assert backend.provider.applied_resources == {"cpus", "memory_mb", "gpus"}
    assert snapshot.unapplied == ("storage_mb=10240",)


def test_a_template_from_a_registry_image_builds_and_its_snapshot_runs(
    standin: ModalStandin, backend: ModalBackend, debian_images: DebianImages
) -> None:
    """End to end: RemoteBackend.build from the image, the setup run in it, the snapshot started."""
    template = Template(name="modal-debian", base=debian_images.base, setup=["echo built > /srv/state"],
                        resources=Resources(cpus=1, memory_mb=2048, storage_mb=4096))  # fmt: skip
    snapshot = backend.build(template)
    assert snapshot.unapplied == ("storage_mb=4096",)
    with backend.create(snapshot) as sandbox:
        seen = sandbox.exec("cat /etc/debian_version /srv/state; pwd")
        assert seen.ok and seen.stdout.startswith("12.") and "built\n/srv\n" in seen.stdout, seen
        record = standin.sandboxes()[str(sandbox.remote_id)]
        assert (record.cpu, record.memory_mb) == (1.0, 2048)


def test_the_sdk_runs_commands_with_stdin_in_an_image_without_python(
    standin: ModalStandin, debian_images: DebianImages
) -> None:
    """``Image.from_registry`` straight from the SDK; the image has no python3, so the stand-in's
    relay is its bash one: stdin until EOF, exit codes and signals, stderr, nothing left behind."""
    client = standin.client()
    app = modal.App.lookup("snapgym-images", create_if_missing=True, client=client)
    sb = modal.Sandbox.create(app=app, image=modal.Image.from_registry(debian_images.base), client=client)
    assert not standin.box(sb.object_id).python3  # type: ignore[union-attr]
    upper = sb.exec("tr", "a-z", "A-Z")
    upper.stdin.write(b"hello ")
    upper.stdin.drain()
    upper.stdin.write("stdin")
    upper.stdin.write_eof()
    upper.stdin.drain()
    assert upper.stdout.read() == "HELLO STDIN" and upper.wait() == 0
    failed = sb.exec("bash", "-c", "echo oops >&2; exit 3")
    assert failed.wait() == 3 and failed.stderr.read() == "oops\n"
    assert sb.exec("bash", "-c", "kill -9 $$").wait() == 137
    assert sb.exec("no-such-command").wait() == 127
    listed = sb.exec("ls", "-A", "/tmp")
    assert listed.wait() == 0 and ".modal-standin" not in listed.stdout.read()
    sb.terminate()
