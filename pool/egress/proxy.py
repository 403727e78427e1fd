"""snapgym's HTTP egress proxy: the only way out of a sandbox's network namespace.

A sandbox has only loopback. For each one, snapgym creates a socket listening
inside the sandbox's namespace and hands it to :meth:`EgressProxy.open_gate`;
the proxy, running in the host process, accepts the sandbox's connections on it
(``HTTP_PROXY``/``HTTPS_PROXY`` point tools there) and reaches the outside world
for it, within the gate's :class:`~pool.network.policy.NetworkPolicy`. Which
socket a connection arrived on says which sandbox it came from; nothing the
client sends can say otherwise.

The client is assumed hostile. Every request is judged on the address the proxy
itself resolved and connects to (:mod:`pool.egress.addresses`), TLS and HTTP
sent through a tunnel must name the tunnel's host (:mod:`pool.egress.connection.opening`),
every wait is bounded, each gate's connections and records are capped
(:class:`~pool.egress.limits.ProxyLimits`), and a gate's records are its own.

Threads: one daemon thread runs the proxy's event loop (started with the first
gate); name lookups run on a small pool of resolver threads. The methods of
:class:`EgressProxy` and :class:`~pool.egress.gate.Gate` may be called from any
other thread.
"""

from __future__ import annotations

import socket
import ssl
import threading
from typing import TYPE_CHECKING

from pool.egress.gate import Gate
from pool.egress.limits import ProxyLimits
from pool.egress.loop import LoopThread
from pool.egress.models.gateway import ModelClient, ModelGate
from pool.egress.models.routes import ModelRoute
from pool.egress.settings import EgressSettings
from pool.errors import BackendError, ConfigError
from pool.network.policy import NetworkPolicy, Phase

if TYPE_CHECKING:
    from pool.egress.cache.downloads import DownloadCache

__all__ = ["EgressProxy", "Gate", "ProxyLimits"]


class EgressProxy:
    """The egress proxy of one host process: a gate per sandbox, one event loop for all.

    Args:
        settings: how the proxy reaches the outside (hosts map, upstream proxy, trusted
            networks, denied ports, the download cache); defaults when None.
        limits: caps and timeouts per gate; defaults when None.

    Raises:
        ConfigError: the download cache is on and its store cannot be opened.
    """

    def __init__(self, settings: EgressSettings | None = None, *, limits: ProxyLimits | None = None) -> None:
        self._settings = settings if settings is not None else EgressSettings()
        self._limits = limits if limits is not None else ProxyLimits()
        self._cache = _download_cache(self._settings)
        self._lock = threading.Lock()
        self._loop: LoopThread | None = None
        self._gates: list[Gate] = []
        self._model_client = ModelClient(self._settings)
        self._model_gates: set[ModelGate] = set()
        self._closed = False

    @property
    def settings(self) -> EgressSettings:
        """The machine's egress settings."""
        return self._settings

    @property
    def sandbox_ca_files(self) -> tuple[str, ...]:
        """PEM files of the CAs sandboxes must trust besides their own: ``extra_ca_files``, and the
        download cache's CA while caching is on (it signs the certificates the proxy presents)."""
        extra = self._settings.extra_ca_files
        return extra if self._cache is None else (*extra, self._cache.ca_file)

    @property
    def is_closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    def open_gate(self, listener: socket.socket, policy: NetworkPolicy, phase: Phase) -> Gate:
        """Serve the connections made to ``listener`` under ``policy``, recorded under ``phase``.

        Args:
            listener: a TCP socket already listening (in the sandbox's network namespace).
                The proxy owns it from this call on, also when the call fails.
            policy: what the connections may reach.
            phase: the phase their records name.

        Raises:
            ConfigError: ``listener`` is not a listening TCP socket.
            BackendError: the proxy is closed.
        """
        try:
            _check_listener(listener)
            with self._lock:
                if self._closed:
                    raise BackendError("the egress proxy is closed")
                if self._loop is None:
                    self._loop = LoopThread()
                gate = Gate(self._loop, listener, policy, phase, self._settings, self._limits, cache=self._cache)
                # not waited for: the listener queues connections until the loop takes them, and
                # the loop runs calls in order, so the gate's close comes after its start
                self._loop.submit(gate.start)
                self._gates = [g for g in self._gates if not g.is_closed] + [gate]
        except BaseException:
            listener.close()
            raise
        return gate

    def open_model_gate(self, listener: socket.socket, route: ModelRoute) -> ModelGate:
        """Serve ``route`` to the sandbox whose namespace ``listener`` listens in (see pool.egress.models.routes).

        The proxy owns ``listener`` from this call on, also when the call fails.

        Raises:
            ConfigError: ``listener`` is not a listening TCP socket, or the route's key is not set here.
            BackendError: the proxy is closed.
        """
        try:
            _check_listener(listener)
            credential = route.credential_headers()
            with self._lock:
                if self._closed:
                    raise BackendError("the egress proxy is closed")
                if self._loop is None:
                    self._loop = LoopThread()
                gate = ModelGate(listener, route, credential, self._model_client)
                self._loop.post(gate.start())
                self._model_gates.add(gate)
        except BaseException:
            listener.close()
            raise
        return gate

    def close_model_gate(self, gate: ModelGate) -> None:
        """Stop ``gate`` (calls still open after a moment are cut); its records stay drainable."""
        with self._lock:
            if gate not in self._model_gates:
                return
            self._model_gates.discard(gate)
            loop = self._loop
        if loop is not None:
            loop.call(gate.shutdown())

    def close(self) -> None:
        """Close every gate (cutting their connections, writing their records) and stop the
        event loop. Records stay drainable from the gates. Closing again does nothing."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            loop, gates, model_gates = self._loop, self._gates, self._model_gates
            self._gates, self._model_gates = [], set()
        if loop is None:
            return
        try:
            for gate in gates:
                loop.call(gate.shutdown("cut: the proxy closed"))
            for model_gate in model_gates:
                loop.call(model_gate.shutdown())
            loop.call(self._model_client.close())
        finally:
            loop.stop()

    def __enter__(self) -> EgressProxy:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _download_cache(settings: EgressSettings) -> DownloadCache | None:
    if not settings.cache.is_on:
        return None
    from pool.egress.cache.downloads import DownloadCache

    try:
        return DownloadCache(settings.cache, settings.extra_ca_files)
    except (OSError, ValueError, ssl.SSLError) as exc:
        raise ConfigError(f"egress cache: cannot open the store at {settings.cache.dir}: {exc}") from None


def _check_listener(listener: socket.socket) -> None:
    try:
        listening = listener.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
    except OSError as exc:
        raise ConfigError(f"the egress gate's socket is unusable: {exc}") from None
    if listener.type != socket.SOCK_STREAM or not listening:
        raise ConfigError("an egress gate needs a TCP socket that is already listening")
