"""The Docker backend: sandboxes as containers of a Docker Engine, snapshots as its images (see backend.py)."""

from pool.backends.docker.backend import DockerBackend
from pool.backends.docker.sandbox import DockerSandbox

__all__ = ["DockerBackend", "DockerSandbox"]
