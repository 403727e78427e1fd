"""The Modal backend: sandboxes are Modal sandboxes (GPU ones too), known-good states are filesystem snapshots.

What every cloud backend does alike (builds named by content hash, the start
digest, hand-offs, strict verification, pacing, reaping) is :mod:`pool.backends.remote`;
this module is Modal's options and capabilities, :mod:`.provider` its SDK calls.
A template or task that asks for GPUs (``Resources.gpus``, ``gpu_types``; task.toml
``[environment] gpus``/``gpu_types``) gets Modal GPU sandboxes (``gpu="A10G"``,
``"H100:2"``), with its CPUs and memory. Builds start from ``base_image``, or from a task's
registry image (``Image.from_registry``, see :mod:`.images`), and end in
``snapshot_filesystem`` (files only). Every sandbox is created with
``block_network`` and Modal's lifetime (``timeout``), so nothing outlives a runner
killed with SIGKILL by more than ``sandbox_timeout_s``; a phase's network policy
replaces the outbound policy at run time (:mod:`.network`).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from pathlib import Path
from typing import Any

import modal
from modal_proto import api_pb2

from pool.backends.modal.errors import provider_errors
from pool.backends.modal.provider import ModalProvider
from pool.backends.remote.backend import RemoteBackend, cloud_capabilities
from pool.backends.remote.credentials import Credentials
from pool.backends.remote.options import RemoteOptions, with_remote_options
from pool.capabilities import Capabilities, Enforcement

NAME = "modal"
GPU_TYPES = (
    "T4",
    "L4",
    "A10G",
    "A10",
    "L40S",
    "A100",
    "A100-40GB",
    "A100-80GB",
    "RTX-PRO-6000",
    "H100",
    "H200",
    "B200",
)
"""Modal's GPU types (``gpu_types`` a task may ask for)."""


class ModalBackend(RemoteBackend):
    """Sandboxes on Modal (https://modal.com), CPU or GPU, through the ``modal`` SDK."""

    name = NAME
    credentials = Credentials(
        {"token_id": "MODAL_TOKEN_ID", "token_secret": "MODAL_TOKEN_SECRET"},
        missing="no Modal token: set MODAL_TOKEN_ID and MODAL_TOKEN_SECRET (modal token new), keep one in "
        "~/.modal.toml, or pass the backend options token_id and token_secret",
        file="~/.modal.toml",
    )

    @with_remote_options
    def __init__(
        self,
        *,
        token_id: str | None = None,
        token_secret: str | None = None,
        server_url: str | None = None,
        app_name: str = "snapgym",
        base_image: str = "debian_slim",
        gpu: str | None = None,
        registry_file: str | None = None,
        **options: Any,
    ) -> None:
        """
        Args:
            token_id: Modal's token id; default ``MODAL_TOKEN_ID`` (or ``~/.modal.toml``).
            token_secret: its secret; default ``MODAL_TOKEN_SECRET``.
            server_url: Modal's API server (default ``MODAL_SERVER_URL``, else Modal's own): a
                self-hosted or stand-in server.
            app_name: the Modal app sandboxes run under (made when missing).
            base_image: what builds start from (snapgym's ``host`` base): ``debian_slim``, an image id
                (``im-...``), or a registry reference.
            gpu: the GPU type for a task that asks for GPUs without naming a type (e.g. ``A10G``).
            registry_file: where the image ids of built templates and of task images are remembered
                on this machine (default: under ``~/.cache/snapgym``); Modal images have no names to find them by.
            **options: the options every cloud backend takes (:class:`~pool.backends.remote.options.RemoteOptions`).
        """
        token = self.credentials.resolve({"token_id": token_id, "token_secret": token_secret})
        token_id, token_secret = token["token_id"], token["token_secret"]
        server_url = server_url or os.environ.get("MODAL_SERVER_URL")
        settings = RemoteOptions(**options)
        self._client = _client(token_id, token_secret, server_url)
        account = f"{token_id or 'modal.toml'}|{server_url or 'modal'}"
        registry = Path(registry_file) if registry_file else _default_registry(account)
        self.base_image = base_image
        provider = ModalProvider(
            self._client, app_name=app_name, base_image=base_image, lifetime_s=settings.sandbox_timeout_s, gpu=gpu,
            registry=registry,
        )  # fmt: skip
        super().__init__(provider, settings, account=account)

    @classmethod
    def declared_capabilities(cls) -> Capabilities:
        """The capabilities, stated without credentials or a connection (they do not depend on options)."""
        return cloud_capabilities(
            gpu=True, gpu_types=GPU_TYPES, isolation=("gvisor",), bases=("host", "image", "dockerfile"),
            limits={**dict.fromkeys(("memory", "cpu"), Enforcement.PROVIDER), "pids": Enforcement.NONE,
                    "disk": Enforcement.NONE},
        )  # fmt: skip

    @property
    def base_identity(self) -> str:
        """The image builds start from."""
        return self.base_image

    def close(self) -> None:
        """End every sandbox this backend made and close the client. Idempotent."""
        super().close()
        closer = getattr(self._client, "__exit__", None)
        if callable(closer):
            with contextlib.suppress(Exception):  # already closed
                closer(None, None, None)


def _client(token_id: str | None, token_secret: str | None, server_url: str | None) -> Any:
    """An opened client: for ``server_url``, made the way ``Client.from_credentials`` makes one (it reads
    the URL only from Modal's configuration); else from the credentials, or Modal's own configuration."""
    with provider_errors("connecting to Modal"):
        if server_url and token_id and token_secret:
            client = modal.Client(server_url, api_pb2.CLIENT_TYPE_CLIENT, (token_id, token_secret))
            client.__enter__()  # type: ignore[no-untyped-call]  # opens the channel
            return client
        if token_id and token_secret:
            return modal.Client.from_credentials(token_id, token_secret)
        return modal.Client.from_env()


def _default_registry(account: str) -> Path:
    digest = hashlib.sha256(account.encode()).hexdigest()[:16]
    return Path("~/.cache/snapgym").expanduser() / f"modal-images-{digest}.json"
