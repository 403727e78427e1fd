"""What a sandbox sees of the egress proxy: an address, the variables that point tools at it,
and the CA bundle they trust when extra CAs are configured or the download cache is on (whose
CA signs the certificates the proxy presents then: see :mod:`pool.egress.cache`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from pool.errors import ConfigError

PROXY_PORT = 3128
"""The proxy's port on the sandbox's loopback (``127.0.0.1``)."""
PROXY_URL = f"http://127.0.0.1:{PROXY_PORT}"
CA_BUNDLE_PATH = "/etc/snapgym/ca-certificates.crt"
"""Where the sandbox's trusted CAs plus the configured extra ones are written."""
SYSTEM_BUNDLES = ("/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt", "/etc/ssl/cert.pem")
"""Where Debian/Ubuntu, Fedora/RHEL and Alpine keep the system's CA bundle."""
_PROXY_VARIABLES = (
    "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy",
    "npm_config_proxy", "npm_config_https_proxy",
)  # fmt: skip
_CA_VARIABLES = ("SSL_CERT_FILE", "CURL_CA_BUNDLE", "REQUESTS_CA_BUNDLE", "PIP_CERT", "GIT_SSL_CAINFO",
                 "NODE_EXTRA_CA_CERTS", "npm_config_cafile")  # fmt: skip


def proxy_environment(ca_bundle_path: str | None = None) -> dict[str, str]:
    """Variables that send curl, wget, pip, uv, git, apt and npm through the proxy (loopback stays direct)."""
    env = dict.fromkeys(_PROXY_VARIABLES, PROXY_URL)
    env["NO_PROXY"] = env["no_proxy"] = "localhost,127.0.0.1,::1"
    if ca_bundle_path is not None:
        env.update(dict.fromkeys(_CA_VARIABLES, ca_bundle_path))
    return env


def ca_bundle(
    extra_ca_files: Sequence[str],
    *,
    read_file: Callable[[str], bytes | None],
    write_file: Callable[[str, bytes], None],
) -> str | None:
    """Write the sandbox's own CA bundle plus ``extra_ca_files`` (the configured extra CAs, and the
    download cache's CA while caching is on) to :data:`CA_BUNDLE_PATH`; its path, or None when
    there are none (tools keep the sandbox's own trust)."""
    if not extra_ca_files:
        return None
    extra = b"".join(_read_pem(path) for path in extra_ca_files)
    system = next((data for path in SYSTEM_BUNDLES if (data := read_file(path))), b"")
    write_file(CA_BUNDLE_PATH, system.rstrip(b"\n") + b"\n" + extra if system else extra)
    return CA_BUNDLE_PATH


def _read_pem(path: str) -> bytes:
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"egress extra_ca_files: cannot read {path}: {exc.strerror}") from None
    if b"-----BEGIN CERTIFICATE-----" not in data:
        raise ConfigError(f"egress extra_ca_files: {path} holds no PEM certificate")
    return data.rstrip(b"\n") + b"\n"
