"""How the egress proxy reaches the outside world on this machine (the same on every node of a run)."""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from pool.egress.cache.settings import CacheSettings
from pool.egress.models.routes import ModelRoute, parse_routes
from pool.egress.sandboxside import SYSTEM_BUNDLES
from pool.errors import ConfigError
from pool.network.policy import IPAddress, IPNetwork, normalise_host, parse_address

RAY_PORTS = (6379, 8265, 10001, 52365)
"""Ray's well-known ports (GCS, dashboard, client server, dashboard agent): refused on every address."""


@dataclass(frozen=True, slots=True)
class EgressSettings:
    """The proxy's side of the network, set per machine or run (never by a task or an agent)."""

    hosts: Mapping[str, str] = field(default_factory=dict, metadata={"config_default": []})
    """Name -> address, used by the proxy's resolver before DNS (like Docker's ``--add-host``).
    :meth:`parse` also takes a list of ``"name=address"`` strings (the form runner configs start from)."""
    upstream_proxy: str | None = field(default=None, repr=False)
    """``http://[user:password@]host:port`` of a proxy every allowed connection goes through (a
    corporate proxy; credentials go to it as ``Proxy-Authorization: Basic``, never to a sandbox).
    The policy is still checked here; names are resolved by the upstream proxy unless ``hosts`` has them."""
    extra_ca_files: tuple[str, ...] = ()
    """PEM files of CA certificates that sandboxes trust besides their own (a corporate TLS proxy's)."""
    trust_host_cas: bool = False
    """Sandboxes trust this machine's CA bundle too (the file ``SSL_CERT_FILE`` names, as OpenSSL
    reads it, else its first system bundle: Debian's ``/etc/ssl/certs/ca-certificates.crt``...), so
    a mirror or host whose CA the machine trusts is trusted inside a task's image as well. What the
    proxy and the download cache trust is unchanged."""
    trusted_networks: tuple[str, ...] = ()
    """CIDRs exempt from the rule that refuses non-global addresses and this machine's own (a test
    network, an internal mirror). The policy still applies to them. A trusted network that holds
    one of this machine's addresses exposes whatever listens there to every sandbox."""
    denied_ports: tuple[int, ...] = RAY_PORTS
    """Ports refused on every address, whatever the policy."""
    connect_timeout_s: float = 10.0
    """How long the proxy waits for a destination to accept."""
    cache: CacheSettings = field(default_factory=CacheSettings)
    """The download cache (:mod:`pool.egress.cache`): ``off``, or ``record``/``replay`` with a ``dir``.
    :meth:`parse` also takes its fields as a mapping."""
    models: tuple[ModelRoute, ...] = ()
    """Model routes (:mod:`pool.egress.models.routes`): the model endpoints an agent inside a sandbox may
    call during its turn, with a key added here. :meth:`parse` also takes a list of mappings or a
    mapping of name -> fields."""
    networks: tuple[IPNetwork, ...] = field(default=(), init=False, compare=False, repr=False)
    host_addresses: Mapping[str, IPAddress] = field(default_factory=dict, init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        addresses = {}
        for name, value in dict(self.hosts).items():
            address = parse_address(str(value))
            if address is None:
                raise ConfigError(f"egress hosts: {name!r} maps to {value!r}, which is not an IP address")
            addresses[normalise_host(str(name))] = address
        object.__setattr__(self, "host_addresses", addresses)
        try:
            networks = tuple(ipaddress.ip_network(n, strict=False) for n in self.trusted_networks)
        except ValueError as exc:
            raise ConfigError(f"egress trusted_networks: {exc}") from None
        object.__setattr__(self, "networks", networks)
        extra = tuple(dict.fromkeys(str(p) for p in self.extra_ca_files))
        if self.trust_host_cas:
            bundle = host_ca_bundle()
            if bundle is None:
                raise ConfigError(
                    f"egress trust_host_cas: this machine has no CA bundle (SSL_CERT_FILE unset, none at "
                    f"{', '.join(SYSTEM_BUNDLES)}); name the CA files with egress.extra_ca_files instead"
                )
            extra = tuple(dict.fromkeys((*extra, bundle)))
        object.__setattr__(self, "extra_ca_files", extra)
        object.__setattr__(self, "trusted_networks", tuple(str(n) for n in self.trusted_networks))
        object.__setattr__(self, "denied_ports", tuple(int(p) for p in self.denied_ports))
        object.__setattr__(self, "cache", CacheSettings.parse(self.cache))
        object.__setattr__(self, "models", parse_routes(self.models))
        if self.upstream_proxy is not None:
            parts = urlsplit(self.upstream_proxy)
            if parts.scheme != "http" or not parts.hostname or parts.port is None:
                raise ConfigError(f"egress upstream_proxy must look like http://host:port, got {self.upstream_proxy!r}")

    @classmethod
    def parse(cls, value: EgressSettings | Mapping[str, Any] | None) -> EgressSettings:
        """Settings from a mapping of these fields (a backend option, a Hydra node); None: defaults."""
        if value is None:
            return cls()
        if isinstance(value, EgressSettings):
            return value
        known = {"hosts", "upstream_proxy", "extra_ca_files", "trusted_networks", "denied_ports", "connect_timeout_s",
                 "trust_host_cas"}  # fmt: skip
        known |= {"cache", "models"}
        unknown = set(value) - known
        if unknown:
            raise ConfigError(f"unknown egress setting(s) {sorted(unknown)}; known: {', '.join(sorted(known))}")
        fields = dict(value)
        for key in ("extra_ca_files", "trusted_networks", "denied_ports"):
            if key in fields:
                fields[key] = tuple(fields[key] or ())
        if "hosts" in fields:
            fields["hosts"] = _hosts_map(fields["hosts"])
        return cls(**fields)

    @property
    def upstream(self) -> tuple[str, int] | None:
        """The upstream proxy's host and port."""
        if self.upstream_proxy is None:
            return None
        parts = urlsplit(self.upstream_proxy)
        assert parts.hostname is not None and parts.port is not None
        return parts.hostname, parts.port

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form for reports (what :meth:`parse` reads, with the upstream password redacted)."""
        return {
            "hosts": dict(self.hosts),
            "upstream_proxy": redacted(self.upstream_proxy),
            "extra_ca_files": list(self.extra_ca_files),
            "trusted_networks": list(self.trusted_networks),
            "denied_ports": list(self.denied_ports),
            "connect_timeout_s": self.connect_timeout_s,
            "cache": self.cache.as_dict(),
            "models": [route.as_dict() for route in self.models],
        }


def host_ca_bundle() -> str | None:
    """The CA bundle this machine's OpenSSL trusts: ``SSL_CERT_FILE`` when it names a file (as OpenSSL
    reads it), else the first system bundle there is; None if neither."""
    named = os.environ.get("SSL_CERT_FILE", "")
    if named and os.path.isfile(named):
        return named
    return next((path for path in SYSTEM_BUNDLES if os.path.isfile(path)), None)


def _hosts_map(value: Any) -> dict[str, str]:
    """``{name: address}`` from a mapping or from ``["name=address", ...]``."""
    if value is None:
        return {}
    if isinstance(value, Mapping):
        return {str(k): str(v) for k, v in value.items()}
    if isinstance(value, str) or not all(isinstance(item, str) and "=" in item for item in value):
        raise ConfigError(f"egress hosts must map names to addresses, or list 'name=address' entries; got {value!r}")
    return dict(item.split("=", 1) for item in value)


def redacted(url: str | None) -> str | None:
    """``url`` with the password of its user info replaced by ``***`` (for logs and records)."""
    if url is None:
        return None
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = f"{parts.username}:***@{parts.hostname}" + (f":{parts.port}" if parts.port else "")
    return parts._replace(netloc=netloc).geturl()
