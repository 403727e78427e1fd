"""Network policies: which hosts a sandbox may reach in one phase of an episode.

The modes and the host syntax are Harbor's (task.toml schema 1.4):

``public``
    Any host on the internet. Addresses that are not global (loopback,
    private, link-local and metadata ranges) stay refused by the egress proxy
    whatever the policy (see :mod:`pool.egress.addresses`).
``no-network``
    Nothing. Attempts still reach snapgym's proxy, which refuses and records
    them, so a run can say what a sandbox tried to reach.
``allowlist``
    Only ``allowed_hosts``: hostnames (``pypi.org``, matched exactly, case
    and a trailing dot ignored), leading-wildcard names (``*.astral.sh``: any
    name below ``astral.sh``, not ``astral.sh`` itself), IP literals
    (``203.0.113.7``, ``2001:db8::1``) and CIDRs (``203.0.113.0/24``). A name
    rule matches the name the client asked for; an address or CIDR rule
    matches the address the proxy connects to (the literal the client gave,
    or what the proxy resolved). Any entry may end in ``:PORT`` (IPv6 as
    ``[2001:db8::1]:443``) to allow that port only.
"""

from __future__ import annotations

import enum
import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pool.errors import ConfigError
from pool.validation import choose

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


class NetworkMode(enum.Enum):
    """What a phase may reach (Harbor's ``network_mode``)."""

    PUBLIC = "public"
    NO_NETWORK = "no-network"
    ALLOWLIST = "allowlist"

    @classmethod
    def parse(cls, value: str | NetworkMode) -> NetworkMode:
        """A mode from its name; ConfigError lists the valid ones."""
        return choose(cls, value, what="network mode")


class Phase(enum.Enum):
    """The part of an episode a policy applies to."""

    BUILD = "build"
    AGENT = "agent"
    VERIFIER = "verifier"


@dataclass(frozen=True, slots=True)
class HostRule:
    """One entry of ``allowed_hosts``, parsed."""

    text: str
    """The entry as written."""
    name: str | None = None
    """A hostname (lower case, no trailing dot), or for a wildcard the suffix after ``*.``."""
    wildcard: bool = False
    network: IPNetwork | None = None
    """An address (as a /32 or /128) or a CIDR."""
    port: int | None = None
    """The only port allowed; None: any."""

    @classmethod
    def parse(cls, text: str) -> HostRule:
        """Parse an entry; ConfigError says what is wrong with it."""
        if not isinstance(text, str) or not text.strip():
            raise ConfigError(f"an allowed host must be a non-empty string, got {text!r}")
        entry = text.strip()
        host, port = _split_port(entry)
        try:
            return cls(text=text, network=ipaddress.ip_network(host, strict=False), port=port)
        except ValueError:
            pass
        wildcard = host.startswith("*.")
        name = normalise_host(host[2:] if wildcard else host)
        if not _is_hostname(name):
            raise ConfigError(f"allowed host {text!r} is neither a hostname, a '*.' wildcard, an IP address nor a CIDR")
        return cls(text=text, name=name, wildcard=wildcard, port=port)

    def matches(self, host: str, port: int, address: IPAddress | None) -> bool:
        """Whether a request for ``host:port``, connecting to ``address``, falls under this rule."""
        if self.port is not None and port != self.port:
            return False
        if self.network is not None:
            return address is not None and address.version == self.network.version and address in self.network
        name = normalise_host(host)
        if self.wildcard:
            return name.endswith("." + str(self.name))
        return name == self.name


@dataclass(frozen=True, slots=True)
class Decision:
    """A policy's answer for one destination."""

    allowed: bool
    rule: str
    """What decided: ``"public"``, ``"no-network"``, ``"allowlist:<entry>"``, ``"allowlist:no match"``."""


@dataclass(frozen=True, slots=True)
class NetworkPolicy:
    """What one phase of an episode may reach."""

    mode: NetworkMode = NetworkMode.NO_NETWORK
    allowed_hosts: tuple[str, ...] = ()
    rules: tuple[HostRule, ...] = field(default=(), compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "mode", NetworkMode.parse(self.mode))
        hosts = tuple(self.allowed_hosts)
        if hosts and self.mode is not NetworkMode.ALLOWLIST:
            raise ConfigError(f"allowed_hosts only goes with network_mode 'allowlist', not {self.mode.value!r}")
        object.__setattr__(self, "allowed_hosts", hosts)
        object.__setattr__(self, "rules", tuple(HostRule.parse(h) for h in hosts))

    @classmethod
    def offline(cls) -> NetworkPolicy:
        """No network at all."""
        return cls(NetworkMode.NO_NETWORK)

    @classmethod
    def public(cls) -> NetworkPolicy:
        """Any global address."""
        return cls(NetworkMode.PUBLIC)

    @classmethod
    def allowlist(cls, hosts: Iterable[str]) -> NetworkPolicy:
        """Only these hosts (see the module docstring for the syntax)."""
        return cls(NetworkMode.ALLOWLIST, tuple(hosts))

    @classmethod
    def parse(cls, value: NetworkPolicy | str | Mapping[str, Any] | Iterable[str]) -> NetworkPolicy:
        """A policy from a mode name (``"offline"`` is ``no-network``), a mapping with
        ``network_mode``/``allowed_hosts``, or a list of hosts (an allowlist)."""
        if isinstance(value, NetworkPolicy):
            return value
        if isinstance(value, str):
            return cls(NetworkMode.parse("no-network" if value == "offline" else value))
        if isinstance(value, Mapping):
            unknown = set(value) - {"network_mode", "allowed_hosts"}
            if unknown:
                known = "allowed_hosts, network_mode"
                raise ConfigError(f"unknown network policy key(s) {sorted(unknown)}; known: {known}")
            hosts = tuple(value.get("allowed_hosts") or ())
            mode = value.get("network_mode") or ("allowlist" if hosts else "no-network")
            return cls(NetworkMode.parse(mode), hosts)
        return cls.allowlist(value)

    @property
    def allows_any(self) -> bool:
        """False for ``no-network``: nothing can be reached."""
        return self.mode is not NetworkMode.NO_NETWORK

    def decide(self, host: str, port: int, address: IPAddress | None = None) -> Decision:
        """Whether ``host:port`` (to be reached at ``address``, when known) is allowed."""
        if self.mode is NetworkMode.PUBLIC:
            return Decision(True, "public")
        if self.mode is NetworkMode.NO_NETWORK:
            return Decision(False, "no-network")
        for rule in self.rules:
            if rule.matches(host, port, address):
                return Decision(True, f"allowlist:{rule.text}")
        return Decision(False, "allowlist:no match")

    def describe(self) -> str:
        """One line for logs: ``public``, ``no-network`` or ``allowlist [a, b]``."""
        if self.mode is NetworkMode.ALLOWLIST:
            return f"allowlist [{', '.join(self.allowed_hosts)}]"
        return str(self.mode.value)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form (Harbor's field names)."""
        return {"network_mode": self.mode.value, "allowed_hosts": list(self.allowed_hosts)}


@dataclass(frozen=True, slots=True)
class PhasePolicies:
    """The policy of each phase: the template's build, the agent's turn, the verifier's."""

    agent: NetworkPolicy = field(default_factory=NetworkPolicy.offline)
    verifier: NetworkPolicy = field(default_factory=NetworkPolicy.offline)
    build: NetworkPolicy = field(default_factory=NetworkPolicy.public)
    """Setup and Dockerfile ``RUN`` steps. Harbor's task format has no setting for it and builds
    with the network, as ``docker build`` does: public unless a run says otherwise."""

    def for_phase(self, phase: Phase) -> NetworkPolicy:
        """The policy of ``phase``."""
        if phase is Phase.VERIFIER:
            return self.verifier
        if phase is Phase.BUILD:
            return self.build
        return self.agent

    @property
    def allows_any(self) -> bool:
        """Whether an episode phase (agent or verifier) may reach something."""
        return self.agent.allows_any or self.verifier.allows_any

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form: ``{"build": {...}, "agent": {...}, "verifier": {...}}``."""
        return {"build": self.build.as_dict(), "agent": self.agent.as_dict(), "verifier": self.verifier.as_dict()}


def normalise_host(host: str) -> str:
    """A hostname as compared: lower case, without a trailing dot or IPv6 brackets."""
    return host.strip().strip("[]").rstrip(".").lower()


def parse_address(host: str) -> IPAddress | None:
    """``host`` as an IP address when it is a literal (IPv4-mapped IPv6 unwrapped), else None."""
    try:
        address = ipaddress.ip_address(normalise_host(host))
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def _split_port(entry: str) -> tuple[str, int | None]:
    if entry.startswith("["):
        host, _, rest = entry[1:].partition("]")
        return host, _port(entry, rest[1:]) if rest.startswith(":") else None
    if entry.count(":") == 1:
        host, _, port = entry.partition(":")
        return host, _port(entry, port)
    return entry, None


def _port(entry: str, text: str) -> int:
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise ConfigError(f"allowed host {entry!r} has an invalid port {text!r}")
    return int(text)


def _is_hostname(name: str) -> bool:
    labels = name.split(".")
    return (
        0 < len(name) <= 253
        and all(0 < len(label) <= 63 for label in labels)
        and all(c.isalnum() or c in "-_" for label in labels for c in label)
        and not any(label.startswith("-") or label.endswith("-") for label in labels)
    )
