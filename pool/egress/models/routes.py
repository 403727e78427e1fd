"""Model routes: the model endpoints an agent inside a sandbox may call, with a key it never sees.

An agent that runs inside the sandbox (Claude Code, Codex CLI, any CLI agent)
needs its model API. Giving it the key would put the key where a prompt
injection, a hostile task or the agent itself can read it. Instead, for each
configured route, snapgym's egress proxy listens at ``127.0.0.1:PORT`` inside
the sandbox's network namespace during the agent's turn (the model gateway,
:mod:`pool.egress.models.gateway`). The agent is pointed there with a placeholder
key (:attr:`ModelRoute.environment`); the gateway drops whatever credential the
request carries, adds the real one, read from the environment of the process
that runs the sandboxes, and forwards the request to the route's upstream
over TLS. The key exists only in that process.

A route is the operator's setting, like the rest of
:class:`~pool.egress.settings.EgressSettings`: a task or an agent cannot add one.
It only reaches its own upstream (whatever the request's Host or URL says), only
under its allowed paths, only with GET and POST, never follows a redirect (which
would carry the key elsewhere), and answers at most ``max_calls`` requests per
agent turn. The task's network policy does not apply to it: it is not the
agent's network but the agent's model.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any
from urllib.parse import urlsplit

from pool.errors import ConfigError
from pool.validation import require_positive

PLACEHOLDER_KEY = "snapgym-placeholder-key"
"""What the agent sees as its API key: not the key, not derived from it."""
APIS = ("anthropic", "openai")
"""The wire protocols a route may speak; they decide the credential header and the defaults."""
_DEFAULT_PORTS = {"anthropic": 3129, "openai": 3130}
_DEFAULT_PATHS = {
    "anthropic": ("/v1/messages", "/v1/models"),
    "openai": ("/v1/chat/completions", "/v1/responses", "/v1/completions", "/v1/models", "/v1/embeddings"),
}
_RESERVED_PORTS = (3128,)  # the egress proxy's own


@dataclass(frozen=True, slots=True)
class ModelRoute:
    """One model endpoint the agent may call through the gateway."""

    name: str
    """The route's name, in records and errors (``anthropic``, ``openai``, ``local-vllm``)."""
    api: str
    """``anthropic`` (the key goes in ``x-api-key``) or ``openai`` (``Authorization: Bearer``)."""
    upstream: str
    """The real endpoint's base URL, ``https://`` only (``https://api.anthropic.com``)."""
    credential_env: str = ""
    """The variable holding the key, in the environment of the process that runs the sandboxes
    (the runner; with ``pool=ray``, every node's). Empty: requests go without a credential."""
    port: int = 0
    """The gateway's port on the sandbox's loopback; 0: 3129 for anthropic, 3130 for openai."""
    paths: tuple[str, ...] = ()
    """The path prefixes the agent may call; empty: the API's own (``/v1/messages``, ``/v1/models``;
    ``/v1/chat/completions``, ``/v1/responses``, ...)."""
    max_calls: int = 2000
    """Requests answered per agent turn; the rest get HTTP 429 (a runaway agent's bill stays bounded)."""
    max_request_bytes: int = 32 << 20
    """The largest request body forwarded (HTTP 413 beyond)."""
    timeout_s: float = 600.0
    """How long one call may take upstream, streaming included."""
    env: Mapping[str, str] = field(default_factory=dict)
    """Extra variables for the agent's commands (``{url}`` and ``{key}`` are filled in), on top of
    the API's own (``ANTHROPIC_BASE_URL``/``ANTHROPIC_API_KEY``, ``OPENAI_BASE_URL``/``OPENAI_API_KEY``)."""
    capture_tokens: bool = False
    """Ask the upstream for each chat completion's token ids and log-probabilities (vLLM's and SGLang's
    ``logprobs``, ``return_token_ids``), record them with the call, and hand the agent the reply without
    them (:mod:`pool.egress.models.tokens`). Off by default: OpenAI's own API refuses the fields."""
    upstream_api: str = ""
    """The upstream's protocol when it is not :attr:`api`: ``openai`` on an ``anthropic`` route sends
    Anthropic Messages on as Chat Completions (:mod:`pool.egress.models.translate`), so Claude Code can run
    on an inference server that returns tokens only there. Empty: the upstream speaks :attr:`api`."""

    def __post_init__(self) -> None:
        if self.api not in APIS:
            raise ConfigError(f"model route {self.name!r}: api must be one of {', '.join(APIS)}, got {self.api!r}")
        if self.upstream_api not in ("", self.api) and (self.api, self.upstream_api) != ("anthropic", "openai"):
            raise ConfigError(
                f"model route {self.name!r}: upstream_api {self.upstream_api!r} is not supported for api {self.api!r}; "
                "the gateway translates only anthropic (the agent's side) to openai (the upstream's)"
            )
        object.__setattr__(self, "upstream_api", "" if self.upstream_api == self.api else self.upstream_api)
        parts = urlsplit(self.upstream)
        if parts.scheme != "https" or not parts.hostname:
            raise ConfigError(
                f"model route {self.name!r}: upstream must be an https:// URL (the key must not cross the "
                f"network in clear), got {self.upstream!r}"
            )
        port = self.port or _DEFAULT_PORTS[self.api]
        if not 1 <= port <= 65535 or port in _RESERVED_PORTS:
            raise ConfigError(f"model route {self.name!r}: port {port} is not usable (3128 is the egress proxy's)")
        object.__setattr__(self, "port", port)
        paths = tuple(str(p) for p in (self.paths or _DEFAULT_PATHS[self.api]))
        if not all(p.startswith("/") for p in paths):
            raise ConfigError(f"model route {self.name!r}: every path must start with '/', got {list(paths)}")
        object.__setattr__(self, "paths", paths)
        object.__setattr__(self, "upstream", self.upstream.rstrip("/"))
        object.__setattr__(self, "env", {str(k): str(v) for k, v in dict(self.env).items()})
        require_positive(self, ("max_calls", "max_request_bytes", "timeout_s"), what=f"model route {self.name!r}:")

    @property
    def url(self) -> str:
        """The gateway's base URL as the agent sees it."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def environment(self) -> dict[str, str]:
        """The variables that point the API's usual clients at the gateway, with the placeholder key."""
        if self.api == "anthropic":
            env = {"ANTHROPIC_BASE_URL": self.url, "ANTHROPIC_API_KEY": PLACEHOLDER_KEY}
        else:
            env = {"OPENAI_BASE_URL": f"{self.url}/v1", "OPENAI_API_KEY": PLACEHOLDER_KEY}
        filled = {k: v.replace("{url}", self.url).replace("{key}", PLACEHOLDER_KEY) for k, v in self.env.items()}
        return {**env, **filled}

    def credential_headers(self) -> dict[str, str]:
        """The header that carries the key upstream, read from :attr:`credential_env` now.

        Raises:
            ConfigError: the variable is named but not set (or empty) in this process.
        """
        if not self.credential_env:
            return {}
        key = os.environ.get(self.credential_env, "")
        if not key:
            raise ConfigError(
                f"model route {self.name!r}: its key's variable {self.credential_env} is not set in the process "
                "that runs the sandboxes; export it there (with pool=ray, on every node)"
            )
        if (self.upstream_api or self.api) == "anthropic":
            return {"x-api-key": key}
        return {"authorization": f"Bearer {key}"}

    def allows(self, method: str, path: str) -> bool:
        """Whether the gateway forwards ``method path`` (a path without its query)."""
        if method not in ("GET", "POST") or "/." in path or "//" in path or "%" in path or "\\" in path:
            return False
        return any(path == p or path.startswith(p.rstrip("/") + "/") for p in self.paths)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form for reports (the variable's name, never its value)."""
        return {**asdict(self), "paths": list(self.paths)}


def parse_routes(value: Any) -> tuple[ModelRoute, ...]:
    """Routes from a list of mappings, or a mapping of name -> fields (the forms a Hydra node takes).

    Raises:
        ConfigError: an unknown field, a duplicate name or port, or a bad value.
    """
    if not value:
        return ()
    items: list[ModelRoute | dict[str, Any]]
    if isinstance(value, Mapping):
        items = [{"name": name, **dict(fields or {})} for name, fields in value.items()]
    elif isinstance(value, Sequence) and not isinstance(value, str):
        items = [route if isinstance(route, ModelRoute) else dict(route) for route in value]
    else:
        raise ConfigError(f"egress models must be a list of routes or a mapping of name -> route, got {value!r}")
    routes = tuple(item if isinstance(item, ModelRoute) else _route(item) for item in items)
    for attribute in ("name", "port"):
        seen = [getattr(r, attribute) for r in routes]
        if len(set(seen)) != len(seen):
            raise ConfigError(f"egress models: two routes share a {attribute}: {seen}")
    return routes


def _route(fields: dict[str, Any]) -> ModelRoute:
    known = set(ModelRoute.__dataclass_fields__)
    unknown = set(fields) - known
    if unknown:
        raise ConfigError(f"unknown model route field(s) {sorted(unknown)}; known: {', '.join(sorted(known))}")
    missing = {"name", "api", "upstream"} - set(fields)
    if missing:
        raise ConfigError(f"model route {fields.get('name', '?')!r} needs {', '.join(sorted(missing))}")
    if "paths" in fields:
        fields["paths"] = tuple(fields["paths"] or ())
    return ModelRoute(**fields)
