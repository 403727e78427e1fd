"""What the Docker backend declares, and why each value is true of it.

- ``in_place_restore=False``: restore hands the sandbox another container (see
  :mod:`.sandbox`); ``memory_snapshot=False``: a commit keeps files, not processes.
- ``fork=True``: n containers of one image start concurrently, sharing its layers.
- ``egress_control``: every sandbox container has ``network_mode=none`` (its own
  network namespace with only ``lo``); only a template's build steps may get the
  engine's bridge. "proxy" when snapgym runs as root beside the engine: its egress
  proxy then listens inside each container's namespace (see :mod:`pool.egress`);
  otherwise "loopback-only".
- ``limits``: memory, PIDs and CPU (the backend's ``cpus`` or a task's) are cgroup
  limits the engine sets, when ``docker info`` says its kernel supports them; disk (the
  backend's ``disk_limit_mb`` or a task's ``storage_mb``) is "quota" where the engine's
  storage driver limits it, "tmpfs" where each layer sits on a tmpfs of its size, "none"
  where neither is possible (see :mod:`.transport.diskquota`).
- ``isolation``: the namespaces every container gets (mount, PID, network, IPC,
  UTS), cgroup limits and no-new-privileges; "user" only when the engine remaps
  user namespaces (``dockerd --userns-remap``) or runs rootless, since otherwise
  the container's root *is* host root (with Docker's reduced capabilities);
  seccomp, AppArmor or SELinux when ``docker info`` lists them.
- ``rootless``: the engine itself runs without root.
- ``verification``: strict only, unless ``shared_verification=True``. A shared
  verifier runs in the agent's container, where the agent's processes can
  signal, trace and write under it (``verifier_isolation="none"``): ten attacks
  of the catalogue (a loop rewriting the reward or the tests, swapped outputs,
  ptrace, SIGSTOP of the verifier...) beat it. A reward an agent can forge is
  worse than none, so shared mode is offered only to whoever asks for it.
- ``sandbox_location`` and ``snapshot_location`` are "node": the engine is this
  machine's (or the one ``base_url`` names), and images are built per engine.

:func:`capability_range` states these values without an engine: on a typical machine, then under
each condition that changes them (the documentation's table comes from it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from pool.backends.docker.transport.engine import EngineInfo
from pool.capabilities import Capabilities, ChangesSource, Enforcement, Location, VerifierIsolation
from pool.egress.onhost.service import EgressService


def declared(
    info: EngineInfo, *, shared_verification: bool, egress: Mapping[str, Any], disk: Enforcement
) -> Capabilities:
    """The capabilities of a backend on the engine ``info`` describes, its disks limited the way ``disk`` says."""
    cgroup, none = Enforcement.CGROUP, Enforcement.NONE
    isolation = ["mount", "pid", "network", "ipc", "uts", "cgroup-limits", "no-new-privileges"]
    if "userns" in info.security or "rootless" in info.security:
        isolation.insert(0, "user")
    isolation += [name for name in ("seccomp", "apparmor", "selinux") if name in info.security]
    return Capabilities(
        in_place_restore=False,
        memory_snapshot=False,
        fork=True,
        gpu=False,
        **egress,
        limits={
            "memory": cgroup if info.memory_limit else none,
            "pids": cgroup if info.pids_limit else none,
            "cpu": cgroup if info.cpu_limit else none,
            "disk": disk,
        },
        isolation=tuple(isolation),
        rootless="rootless" in info.security,
        verification=("strict", "shared") if shared_verification else ("strict",),
        verifier_isolation=VerifierIsolation.NONE,
        sandbox_location=Location.NODE,
        snapshot_location=Location.NODE,
        bases=("host", "rootfs", "image", "dockerfile"),
        changes=ChangesSource.ENGINE,
    )


def capability_range() -> dict[str, Capabilities]:
    """What a backend with the default options declares on a typical machine, then under each condition
    that changes it (``DockerBackend.capability_range``): the engine's ``docker info`` and storage
    driver, where the engine runs, running as root, ``shared_verification``."""
    engine = EngineInfo("", ("seccomp",), memory_limit=True, pids_limit=True, cpu_limit=True, storage_driver="overlay2")
    typical: dict[str, Any] = {
        "info": engine,
        "shared_verification": False,
        "egress": EgressService(None).capability_fields,
        "disk": Enforcement.TMPFS,
    }

    def under(**changes: Any) -> Capabilities:
        return declared(**{**typical, **changes})

    return {
        "an engine on this machine, overlay2 on ext4, root": under(),
        "a storage driver with a quota (overlay2 on xfs with pquota, btrfs, zfs)": under(disk=Enforcement.QUOTA),
        "a remote engine or not root, on a driver without a quota (allowed only with `disk_limit_mb=None`: "
        "otherwise the backend refuses to start)": under(
            egress=EgressService(None, available=False).capability_fields, disk=Enforcement.NONE
        ),
        "an engine without cgroup limits (docker info)": under(
            info=replace(engine, memory_limit=False, pids_limit=False, cpu_limit=False)
        ),
        "the option `shared_verification=True`": under(shared_verification=True),
    }
