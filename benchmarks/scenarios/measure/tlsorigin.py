"""A throwaway CA, a tiny HTTP(S) origin and a request-timing client, for the egress benchmark.

The origin and the client are stand-alone scripts run with ``python3 -c``: the
same origin code serves inside a sandbox (on its loopback) and on the host, and
the client runs inside the sandbox, so neither needs this package.
"""

from __future__ import annotations

import datetime
import json
import shlex
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

BODY_BYTES = 256
"""Size of the origin's response body."""

ORIGIN_SCRIPT = f"""\
import http.server, ssl, sys, threading
BODY = b"x" * {BODY_BYTES}
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", str(len(BODY)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(BODY)
    def log_message(self, *args):
        pass
class Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 64
cert, key, http_port, https_port = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
context.load_cert_chain(cert, key)
plain = Server(("127.0.0.1", http_port), Handler)
tls = Server(("127.0.0.1", https_port), Handler)
tls.socket = context.wrap_socket(tls.socket, server_side=True)
print(plain.server_address[1], tls.server_address[1], flush=True)
threading.Thread(target=plain.serve_forever, daemon=True).start()
tls.serve_forever()
"""

# Every request opens a new TCP connection (and TLS session); only the client's loop is timed.
CLIENT_SCRIPT = """\
import json, socket, ssl, sys, time
cafile, rounds, warmup, targets = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), json.loads(sys.argv[4])
context = ssl.create_default_context(cafile=cafile)

def read_head(sock):
    data = b""
    while b"\\r\\n\\r\\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed before the end of the head: %r" % data[:200])
        data += chunk
    head, _, rest = data.partition(b"\\r\\n\\r\\n")
    status = int(head.split(b" ", 2)[1])
    return status, head, rest

def fetch(target):
    _, tls, host, port, proxied, origin, origin_port = target
    authority = "%s:%d" % (origin, origin_port)
    sock = socket.create_connection((host, port), timeout=10)
    try:
        if proxied and tls:
            sock.sendall(("CONNECT %s HTTP/1.1\\r\\nHost: %s\\r\\n\\r\\n" % (authority, authority)).encode())
            status, head, _ = read_head(sock)
            if status != 200:
                raise ConnectionError("CONNECT refused: %r" % head[:200])
        if tls:
            sock = context.wrap_socket(sock, server_hostname=origin)
        path = "http://%s/" % authority if proxied and not tls else "/"
        sock.sendall(("GET %s HTTP/1.1\\r\\nHost: %s\\r\\nConnection: close\\r\\n\\r\\n" % (path, authority)).encode())
        status, head, body = read_head(sock)
        fields = [line.split(b":", 1) for line in head.split(b"\\r\\n")[1:]]
        length = int(next(value for name, value in fields if name.strip().lower() == b"content-length"))
        while len(body) < length:
            chunk = sock.recv(65536)
            if not chunk:
                break
            body += chunk
        if status != 200 or len(body) != length:
            raise ConnectionError("bad response %d, %d of %d bytes" % (status, len(body), length))
    finally:
        sock.close()

for target in targets:  # wait for the origins to listen
    deadline = time.monotonic() + 15
    while True:
        try:
            fetch(target)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
for index in range(warmup + rounds):
    shift = index % len(targets)
    for target in targets[shift:] + targets[:shift]:
        started = time.perf_counter_ns()
        fetch(target)
        elapsed = time.perf_counter_ns() - started
        if index >= warmup:
            print(target[0], elapsed / 1e6)
"""


@dataclass(frozen=True, slots=True)
class Target:
    """Where the client sends one kind of request."""

    name: str
    """Method name the samples are reported under."""
    tls: bool
    """HTTPS (a TLS handshake per request) or plain HTTP."""
    host: str
    """Address the client connects to (the origin, or the proxy)."""
    port: int
    proxied: bool
    """Through an HTTP proxy at host:port: CONNECT for HTTPS, an absolute-form GET for HTTP."""
    origin: str
    """Name of the origin (TLS server name and Host header)."""
    origin_port: int


@dataclass(frozen=True, slots=True)
class Certificates:
    """PEM bytes of a CA and of a server certificate and key it signed."""

    ca_pem: bytes
    cert_pem: bytes
    key_pem: bytes


def issue(server_name: str) -> Certificates:
    """A new CA and a certificate for ``server_name`` (EC P-256, valid for a day)."""
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "snapgym egress benchmark CA")])
    now = datetime.datetime.now(datetime.UTC)

    def builder(subject: x509.Name, public_key: ec.EllipticCurvePublicKey, ca: bool) -> x509.CertificateBuilder:
        return (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(ca_name)
            .public_key(public_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )

    ca_cert = (
        builder(ca_name, ca_key.public_key(), True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    server = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, server_name)])
    cert = (
        builder(server, key.public_key(), False)
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(server_name)]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    key_pem = key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    return Certificates(ca_cert.public_bytes(pem), cert.public_bytes(pem), key_pem)


def origin_command(cert_path: str, key_path: str, http_port: int, https_port: int) -> str:
    """Shell command that serves the origin with ``python3`` (port 0: any free one)."""
    return shlex.join(["python3", "-c", ORIGIN_SCRIPT, cert_path, key_path, str(http_port), str(https_port)])


def start_host_origin(cert_path: str, key_path: str) -> tuple[subprocess.Popen[str], int, int]:
    """The origin as a host process on free loopback ports: the process, its HTTP and HTTPS ports."""
    process = subprocess.Popen(
        [sys.executable, "-c", ORIGIN_SCRIPT, cert_path, key_path, "0", "0"], stdout=subprocess.PIPE, text=True
    )
    assert process.stdout is not None
    line = process.stdout.readline().split()
    if len(line) != 2:
        process.kill()
        process.wait()
        raise RuntimeError(f"the host origin did not start (exit {process.poll()})")
    return process, int(line[0]), int(line[1])


def client_command(cafile: str, targets: Sequence[Target], *, rounds: int, warmup: int) -> str:
    """Shell command that times ``rounds`` requests to each target, printing ``name ms`` per request."""
    spec = json.dumps([[t.name, t.tls, t.host, t.port, t.proxied, t.origin, t.origin_port] for t in targets])
    return shlex.join(["python3", "-c", CLIENT_SCRIPT, cafile, str(rounds), str(warmup), spec])


def parse_samples(stdout: str, names: Sequence[str]) -> dict[str, list[float]]:
    """The client's output as milliseconds per target name."""
    samples: dict[str, list[float]] = {name: [] for name in names}
    for line in stdout.splitlines():
        name, _, value = line.partition(" ")
        samples[name].append(float(value))
    return samples
