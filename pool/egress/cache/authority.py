"""The store's certificate authority: what lets the proxy answer TLS for any host while caching is on.

On first use a store gets its own CA, made here with ``cryptography``: ``ca/ca.pem`` (the
certificate sandboxes are told to trust) and ``ca/ca.key`` (mode 0600, in a 0700 folder;
it never leaves the host unless the store is exported). Several processes may make it at once
(the nodes of a cluster on one shared folder): each writes a complete candidate aside and
renames it into place, and whoever loses the race loads the winner's.

For each host a sandbox tunnels to, the proxy signs a leaf certificate (an EC P-256 key of
its own, valid for a week, naming only that host) and keeps it in memory; nothing about
leaves is written to the store.
"""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import os
import shutil
import ssl
import tempfile
import threading
from collections import OrderedDict
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_CERT = "ca.pem"
CA_KEY = "ca.key"
MAX_LEAVES = 1024
"""Server contexts kept in memory (least recently used ones are dropped)."""
_LEAF_DAYS = 7
_CA_YEARS = 10


class StoreAuthority:
    """The CA of the store at ``folder`` (made there on first use) and the leaf contexts it signs."""

    def __init__(self, folder: str | os.PathLike[str]) -> None:
        self.folder = Path(folder) / "ca"
        self._key, self._cert = _load_or_make(self.folder)
        self._leaves: OrderedDict[str, tuple[ssl.SSLContext, datetime.datetime]] = OrderedDict()
        self._lock = threading.Lock()

    @property
    def cert_path(self) -> Path:
        """The CA certificate (PEM) sandboxes trust while caching is on."""
        return self.folder / CA_CERT

    @property
    def key_path(self) -> Path:
        """The CA's private key (PEM, mode 0600)."""
        return self.folder / CA_KEY

    def server_context(self, host: str) -> ssl.SSLContext:
        """A TLS server context presenting a certificate for ``host`` (a name or an address)."""
        now = datetime.datetime.now(datetime.UTC)
        with self._lock:
            cached = self._leaves.get(host)
            if cached is not None and cached[1] > now + datetime.timedelta(days=1):
                self._leaves.move_to_end(host)
                return cached[0]
        context, expires = self._sign(host, now)
        with self._lock:
            self._leaves[host] = (context, expires)
            while len(self._leaves) > MAX_LEAVES:
                self._leaves.popitem(last=False)
        return context

    def _sign(self, host: str, now: datetime.datetime) -> tuple[ssl.SSLContext, datetime.datetime]:
        key = ec.generate_private_key(ec.SECP256R1())
        try:
            name: x509.GeneralName = x509.IPAddress(ipaddress.ip_address(host))
        except ValueError:
            name = x509.DNSName(host)
        expires = now + datetime.timedelta(days=_LEAF_DAYS)
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host[:64])]))
            .issuer_name(self._cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(expires)
            .add_extension(x509.SubjectAlternativeName([name]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()), critical=False)
            .sign(self._key, hashes.SHA256())
        )
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.set_alpn_protocols(["http/1.1"])
        # ssl loads a certificate chain from files only: a private folder, gone once loaded.
        with tempfile.TemporaryDirectory(prefix="snapgym-leaf-") as folder:
            path = Path(folder) / "leaf.pem"
            path.touch(mode=0o600)
            path.write_bytes(_pem_key(key) + cert.public_bytes(serialization.Encoding.PEM))
            context.load_cert_chain(path)
        return context, expires


def _load_or_make(folder: Path) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    if not (folder / CA_KEY).exists():
        _make(folder)
    key = serialization.load_pem_private_key((folder / CA_KEY).read_bytes(), password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ValueError(f"{folder / CA_KEY} is not an EC private key")
    return key, x509.load_pem_x509_certificate((folder / CA_CERT).read_bytes())


def _make(folder: Path) -> None:
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=folder.parent, prefix="ca-"))  # mode 0700
    try:
        key = ec.generate_private_key(ec.SECP256R1())
        (staging / CA_KEY).touch(mode=0o600)
        (staging / CA_KEY).write_bytes(_pem_key(key))
        (staging / CA_CERT).write_bytes(_ca_cert(key).public_bytes(serialization.Encoding.PEM))
        with contextlib.suppress(FileExistsError, OSError):
            os.rename(staging, folder)  # fails when another process made it first: use theirs
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _ca_cert(key: ec.EllipticCurvePrivateKey) -> x509.Certificate:
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "snapgym download cache CA")])
    now = datetime.datetime.now(datetime.UTC)
    usage = x509.KeyUsage(
        digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False, key_encipherment=False,
        data_encipherment=False, key_agreement=False, encipher_only=False, decipher_only=False,
    )  # fmt: skip
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=365 * _CA_YEARS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(usage, critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    encoding, private = serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8
    return key.private_bytes(encoding, private, serialization.NoEncryption())
