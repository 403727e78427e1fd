"""The model gateway: a sandbox's route to its agent's model, adding the key on the host's side.

One :class:`ModelGate` serves one :class:`~pool.egress.models.routes.ModelRoute` for
one sandbox, on a socket listening inside the sandbox's network namespace (as
the egress proxy's gates do), on the egress proxy's event loop. The HTTP on
both sides is aiohttp's (a low-level ``web.Server`` per gate, one client
session per proxy): a reverse proxy that must stream server-sent events back
as they come is what it is made for.

The client is assumed hostile. Whatever the request says (Host, an absolute
URL, its own credentials), the gateway sends it to the route's upstream only,
under the route's paths only, with the route's key instead of any the client
sent, asks for an uncompressed reply and never follows a redirect. The key
does not come back either: a reply that holds it (headers or body) has it
replaced by asterisks of the same length. Every call is recorded
(:class:`~pool.network.audit.ModelCall`) with the tokens the reply reports, and, on a route that
captures them, the token ids and log-probabilities (:mod:`pool.egress.models.capture`).
"""

from __future__ import annotations

import asyncio
import json
import socket
import ssl
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from aiohttp import web
from aiohttp.abc import AbstractResolver, ResolveResult

from pool.egress.models.capture import Rewriter, rewriter_for
from pool.egress.models.routes import ModelRoute
from pool.egress.models.usage import MAX_BODY_BYTES, Usage, read_usage
from pool.egress.settings import EgressSettings
from pool.network.audit import ALLOWED, DENIED, UNREACHABLE, ModelCall

MAX_RECORDS_OVER_CAP = 100
"""Refused calls recorded past a route's call cap; later ones are only counted."""
SHUTDOWN_S = 1.0
"""How long a closing gate waits for its calls to finish before cutting them."""
_HOP_BY_HOP = {
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "proxy-connection", "te",
    "trailer", "transfer-encoding", "upgrade", "host", "content-length", "content-encoding",
}  # fmt: skip
_CLIENT_CREDENTIALS = {"authorization", "x-api-key", "api-key", "cookie", "x-goog-api-key", "openai-organization"}
_PATH_CAP = 512


class ModelClient:
    """The gateways' way to the upstreams: one aiohttp session, made on the proxy's loop when first used.

    Args:
        settings: the machine's egress settings: the hosts map (names resolved before DNS), the
            upstream proxy, and extra CAs the upstreams' certificates may chain to.
    """

    def __init__(self, settings: EgressSettings) -> None:
        self._settings = settings
        self._session: aiohttp.ClientSession | None = None

    def session(self) -> aiohttp.ClientSession:
        """The session (call on the proxy's loop)."""
        if self._session is None:
            connector = aiohttp.TCPConnector(
                ssl=_tls_context(self._settings), resolver=_HostsResolver(self._settings), limit=256
            )
            self._session = aiohttp.ClientSession(connector=connector, auto_decompress=False, trust_env=False)
        return self._session

    @property
    def upstream_proxy(self) -> tuple[str | None, aiohttp.BasicAuth | None]:
        """The upstream proxy's URL without its user info, and that user info as basic auth."""
        url = self._settings.upstream_proxy
        if url is None:
            return None, None
        parts = urlsplit(url)
        auth = aiohttp.BasicAuth(parts.username or "", parts.password or "") if parts.username else None
        return f"http://{parts.hostname}:{parts.port}", auth

    async def close(self) -> None:
        """Close the session (call on the proxy's loop)."""
        if self._session is not None:
            await self._session.close()
            self._session = None


class ModelGate:
    """One sandbox's gateway to one model route, from :meth:`start` until :meth:`shutdown`.

    Args:
        listener: a TCP socket listening in the sandbox's namespace; the gate owns it.
        route: the route it serves.
        credential: the headers that carry the key (from :meth:`ModelRoute.credential_headers`).
        client: the proxy's :class:`ModelClient`.
    """

    def __init__(
        self, listener: socket.socket, route: ModelRoute, credential: Mapping[str, str], client: ModelClient
    ) -> None:
        self.route = route
        self._listener = listener
        self._credential = dict(credential)
        self._secrets = [value.split(" ")[-1].encode() for value in credential.values() if value]
        self._client = client
        self._server: asyncio.Server | None = None
        self._web: web.Server | None = None
        self._records: list[ModelCall] = []
        self._calls = 0
        self.dropped = 0
        """Refused calls past the cap and :data:`MAX_RECORDS_OVER_CAP`: counted, not recorded."""

    async def start(self) -> None:
        """Serve the listener (call on the proxy's loop)."""
        self._web = web.Server(self._handle, access_log=None)
        self._server = await asyncio.get_running_loop().create_server(self._web, sock=self._listener)

    async def shutdown(self) -> None:
        """Stop listening, give open calls :data:`SHUTDOWN_S` to end, then cut them (on the loop)."""
        if self._server is not None:
            self._server.close()
        if self._web is not None:
            await self._web.shutdown(SHUTDOWN_S)
        self._server = self._web = None
        self._listener.close()

    def drain(self) -> tuple[list[ModelCall], int]:
        """The calls recorded since the last drain, and how many went unrecorded."""
        records, self._records = self._records, []
        dropped, self.dropped = self.dropped, 0
        return records, dropped

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        call = _Call(self.route.name, request.method, request.rel_url.raw_path[:_PATH_CAP])
        try:
            return await self._serve(request, call)
        finally:
            self._record(call.finish())

    async def _serve(self, request: web.BaseRequest, call: _Call) -> web.StreamResponse:
        route = self.route
        if self._calls >= route.max_calls:
            return call.refuse(429, f"call cap {route.max_calls} reached")
        self._calls += 1
        if not route.allows(request.method, request.rel_url.raw_path):
            return call.refuse(403, "path or method not allowed")
        body = await _read_body(request, route.max_request_bytes)
        if body is None:
            return call.refuse(413, f"request body over {route.max_request_bytes} bytes")
        call.model, call.bytes_up = _model_name(body), len(body)
        try:
            async with asyncio.timeout(route.timeout_s):
                return await self._forward(request, body, call)
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            reason = "timed out" if isinstance(exc, TimeoutError) else f"{type(exc).__name__}: {exc}"
            return call.unreachable(f"upstream: {reason}"[:500])

    async def _forward(self, request: web.BaseRequest, body: bytes, call: _Call) -> web.StreamResponse:
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_BY_HOP | _CLIENT_CREDENTIALS}
        headers.update(self._credential, **{"accept-encoding": "identity"})
        proxy, proxy_auth = self._client.upstream_proxy
        rewriter, uncaptured = rewriter_for(self.route, request.method, request.rel_url.raw_path_qs, body)
        call.tokens = uncaptured.as_dict() if uncaptured is not None else None
        url = self.route.upstream + (rewriter.path if rewriter else request.rel_url.raw_path_qs)
        session = self._client.session()
        async with session.request(
            request.method, url, headers=headers, data=rewriter.body if rewriter else body, allow_redirects=False,
            proxy=proxy, proxy_auth=proxy_auth,
        ) as upstream:  # fmt: skip
            reply = web.StreamResponse(status=upstream.status, headers=self._reply_headers(upstream, rewriter))
            call.status, call.prepared = upstream.status, True
            await reply.prepare(request)
            redactor, kept = _Redactor(self._secrets), bytearray()
            async for chunk in upstream.content.iter_any():
                if len(kept) <= MAX_BODY_BYTES:
                    kept += chunk
                await reply.write(redactor.feed(rewriter.feed(chunk) if rewriter else chunk))
                call.bytes_down += len(chunk)
            if rewriter is not None:
                await reply.write(redactor.feed(rewriter.finish()))
                captured = rewriter.captured()
                call.tokens = captured.as_dict() if captured is not None else None
            await reply.write(redactor.flush())
            await reply.write_eof()
            if len(kept) <= MAX_BODY_BYTES:
                call.usage = read_usage(bytes(kept), upstream.headers.get("content-type", ""))
            return reply

    def _reply_headers(self, upstream: aiohttp.ClientResponse, rewriter: Rewriter | None) -> dict[str, str]:
        headers = {}
        for name, value in upstream.headers.items():
            if name.lower() in _HOP_BY_HOP or name.lower() == "set-cookie":
                continue
            headers[name] = _Redactor(self._secrets).redact_text(value)
        content_type = rewriter.start(upstream.status, upstream.headers) if rewriter is not None else None
        if content_type is not None:
            headers = {k: v for k, v in headers.items() if k.lower() != "content-type"}
            headers["content-type"] = content_type
        return headers

    def _record(self, call: ModelCall) -> None:
        if len(self._records) < self.route.max_calls + MAX_RECORDS_OVER_CAP:
            self._records.append(call)
        else:
            self.dropped += 1


class _Call:
    """A call's record in the making."""

    def __init__(self, route: str, method: str, path: str) -> None:
        self.time, self._started = time.time(), time.monotonic()
        self.route, self.method, self.path = route, method, path.split("?", 1)[0]
        self.verdict, self.status = ALLOWED, 0
        self.error: str | None = None
        self.model: str | None = None
        self.usage = Usage()
        self.tokens: dict[str, Any] | None = None
        self.bytes_up = self.bytes_down = 0
        self.prepared = False

    def refuse(self, status: int, reason: str) -> web.Response:
        self.verdict, self.status, self.error = DENIED, status, reason
        return _error_reply(status, f"snapgym model gateway: {reason}")

    def unreachable(self, reason: str) -> web.StreamResponse:
        self.verdict, self.error = UNREACHABLE, reason
        if self.prepared:  # the reply had begun: cut it, the client sees a truncated body
            raise ConnectionResetError(reason)
        self.status = 502
        return _error_reply(502, f"snapgym model gateway: {reason}")

    def finish(self) -> ModelCall:
        return ModelCall(
            time=self.time, route=self.route, method=self.method, path=self.path, verdict=self.verdict,
            status=self.status, model=self.model, input_tokens=self.usage.input_tokens,
            output_tokens=self.usage.output_tokens, cached_input_tokens=self.usage.cached_input_tokens,
            bytes_up=self.bytes_up, bytes_down=self.bytes_down,
            duration_s=round(time.monotonic() - self._started, 6), error=self.error, tokens=self.tokens,
        )  # fmt: skip


class _Redactor:
    """Replaces the secrets in a byte stream by asterisks of the same length, across chunk boundaries."""

    def __init__(self, secrets: list[bytes]) -> None:
        self._secrets = [s for s in secrets if s]
        self._hold = max((len(s) for s in self._secrets), default=1) - 1
        self._pending = b""

    def feed(self, chunk: bytes) -> bytes:
        data = self._redact(self._pending + chunk)
        cut = len(data) - self._hold
        if cut <= 0:
            self._pending = data
            return b""
        self._pending = data[cut:]
        return data[:cut]

    def flush(self) -> bytes:
        data, self._pending = self._pending, b""
        return data

    def redact_text(self, text: str) -> str:
        return self._redact(text.encode("utf-8", "surrogateescape")).decode("utf-8", "surrogateescape")

    def _redact(self, data: bytes) -> bytes:
        for secret in self._secrets:
            data = data.replace(secret, b"*" * len(secret))
        return data


async def _read_body(request: web.BaseRequest, cap: int) -> bytes | None:
    """The request body, or None when it is longer than ``cap`` (nothing more is read then)."""
    if request.content_length is not None and request.content_length > cap:
        return None
    body = bytearray()
    async for chunk in request.content.iter_chunked(1 << 16):
        body += chunk
        if len(body) > cap:
            return None
    return bytes(body)


def _model_name(body: bytes) -> str | None:
    try:
        model = json.loads(body).get("model") if body else None
    except (ValueError, UnicodeDecodeError, AttributeError):
        return None
    return str(model)[:200] if model is not None else None


def _error_reply(status: int, message: str) -> web.Response:
    payload = {"type": "error", "error": {"type": "snapgym_gateway_error", "message": message}}
    return web.json_response(payload, status=status)


def _tls_context(settings: EgressSettings) -> ssl.SSLContext:
    context = ssl.create_default_context()
    for path in settings.extra_ca_files:
        context.load_verify_locations(cafile=path)
    return context


class _HostsResolver(AbstractResolver):
    """The egress settings' hosts map first (a test network, an internal mirror), then the system's."""

    def __init__(self, settings: EgressSettings) -> None:
        self._hosts = settings.host_addresses
        self._system = aiohttp.ThreadedResolver()

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        address = self._hosts.get(host.lower().rstrip("."))
        if address is None:
            return await self._system.resolve(host, port, family)
        found_family = socket.AF_INET6 if address.version == 6 else socket.AF_INET
        return [ResolveResult(hostname=host, host=str(address), port=port, family=found_family, proto=0, flags=0)]

    async def close(self) -> None:
        await self._system.close()
