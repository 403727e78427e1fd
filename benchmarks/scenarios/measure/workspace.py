"""The deterministic benchmark workspace, made the same way inside a sandbox and on the host.

One stand-alone Python script writes (or digests) the tree; the sandbox runs
it with its own ``python3`` in a template setup step, the host runs it with
``sys.executable``. Equal digests prove both copies hold the same bytes.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

from benchmarks.config import WorkspaceConfig
from pool import Template

SANDBOX_ROOT = "/workspace"

# Stand-alone on purpose: it runs inside sandboxes, where this package is not importable.
_SCRIPT = """\
import hashlib, os, random, sys

def write(root, n_files, mean_bytes, seed):
    rng = random.Random(seed)
    for i in range(n_files):
        folder = os.path.join(root, "data", f"{i // 100:03d}")
        os.makedirs(folder, exist_ok=True)
        size = rng.randint(mean_bytes // 2, mean_bytes + mean_bytes // 2)
        with open(os.path.join(folder, f"f{i:05d}.bin"), "wb") as out:
            out.write(rng.randbytes(size))

def digest(root):
    total = hashlib.sha256()
    for folder, subdirs, names in os.walk(root):
        subdirs.sort()
        for name in sorted(names):
            path = os.path.join(folder, name)
            with open(path, "rb") as f:
                total.update(os.path.relpath(path, root).encode() + b"\\0" + hashlib.sha256(f.read()).digest())
    print(total.hexdigest())

if sys.argv[1] == "write":
    write(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
else:
    digest(sys.argv[2])
"""


def write_command(spec: WorkspaceConfig, root: str = SANDBOX_ROOT) -> str:
    """Shell command that writes the workspace under ``root`` with ``python3``."""
    args = ["write", root, str(spec.n_files), str(spec.mean_file_bytes), str(spec.seed)]
    return shlex.join(["python3", "-c", _SCRIPT, *args])


def digest_command(root: str = SANDBOX_ROOT) -> str:
    """Shell command that prints the workspace digest with ``python3``."""
    return shlex.join(["python3", "-c", _SCRIPT, "digest", root])


def last_file(spec: WorkspaceConfig, root: str = SANDBOX_ROOT) -> str:
    """Path of the last file written, for a healthcheck."""
    index = spec.n_files - 1
    return f"{root}/data/{index // 100:03d}/f{index:05d}.bin"


def template(spec: WorkspaceConfig) -> Template:
    """A template whose snapshot holds the workspace at ``/workspace``."""
    if spec.n_files < 1 or spec.mean_file_bytes < 2:
        raise ValueError(f"the workspace needs files of at least 2 bytes, got {spec}")
    return Template(
        name="bench-workspace",
        setup=[write_command(spec)],
        workdir=SANDBOX_ROOT,
        healthcheck=f"test -f {shlex.quote(last_file(spec))}",
    )


def materialize(spec: WorkspaceConfig, root: Path) -> str:
    """Write the workspace under ``root`` on the host; returns its digest."""
    _host_script("write", str(root), str(spec.n_files), str(spec.mean_file_bytes), str(spec.seed))
    return host_digest(root)


def host_digest(root: Path) -> str:
    """Digest of a workspace tree on the host."""
    return _host_script("digest", str(root)).strip()


def _host_script(*args: str) -> str:
    done = subprocess.run([sys.executable, "-c", _SCRIPT, *args], capture_output=True, text=True, check=True)
    return done.stdout
