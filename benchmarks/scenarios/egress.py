"""Egress: what snapgym's host-side egress proxy costs per episode, per command and per request.

Method:
    At start a CA and a certificate for ``origin.bench`` are made with
    ``cryptography`` (:mod:`benchmarks.scenarios.measure.tlsorigin`), and the origin (Python's
    ``http.server``, HTTP and HTTPS, a 256-byte body, ``Connection: close``)
    starts as a host process on free ports of 127.0.0.1. A backend is opened
    from the configured one's options with egress settings that map
    ``origin.bench`` to 127.0.0.1, trust 127.0.0.1/32, add the CA to
    ``extra_ca_files`` (so ``set_network`` writes a CA bundle, as a real
    configuration with a private CA does) and use no upstream proxy. Two
    sandboxes start from one snapshot of the host userland: ``plain`` never
    gets a network, ``net`` gets ``NetworkPolicy.public()`` for the agent
    phase. Each pair below is measured interleaved (A, B, then B, A, ...), so
    drift on a busy machine hits both alike; ``warmup`` iterations of each pair
    are discarded first. The clock is ``time.perf_counter_ns`` around the call.

    - ``reset`` vs ``reset_with_network``: before each iteration, untimed, one
      exec writes a file in /tmp; then ``plain.restore()`` is timed, against
      ``net.restore()`` plus ``net.set_network(public)``. ``net`` had a network
      in the episode before, so its restore also closes that episode's gate:
      the difference is what networking adds to each episode boundary.
    - ``exec_true`` vs ``exec_true_with_proxy_env``: ``sandbox.exec("true")`` on
      ``plain`` against ``net`` with its network set (every command there gets
      the proxy's variables and the CA bundle's path).
    - ``https_direct`` vs ``https_via_proxy`` (and ``http_direct`` vs
      ``http_via_proxy`` when ``plain_http``): the same origin code is started
      inside ``net`` on its loopback (8443, 8080). One Python client process
      inside ``net`` then makes ``warmup + requests`` rounds, each round one
      request per method in rotating order, and prints each request's time:
      interpreter start-up is not in the numbers. Every request is a new TCP
      connection: direct ones go to 127.0.0.1 with TLS server name
      ``origin.bench``; proxied HTTPS ones send ``CONNECT origin.bench:<host
      port>`` to the proxy's address from ``set_network``'s ``HTTPS_PROXY``,
      then the same TLS handshake; proxied HTTP sends an absolute-form GET. The
      client trusts the benchmark CA only, verifies the name, reads the whole
      body. Both origins run the same script as their own process, each on an
      otherwise idle loopback, so the difference is the proxy's path: the
      sandbox-to-proxy hop, the proxy's policy check, name lookup (hosts map)
      and the relay to the host origin. ``network_log()`` must then show every
      proxied request allowed; its summary is in ``meta.audit``.

    Without an egress proxy (``capabilities.egress_control`` other than
    "proxy", e.g. a rootless local backend) the network methods are skipped
    with the reason and the others still run. Per method: p50, p90, p99, mean
    and n in ms; ratios divide the proxied (or networked) p50 by its baseline's
    p50; the added p50 (B minus A, ms) is printed under the table and kept in
    the headline.
"""

from __future__ import annotations

import os
import platform
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from benchmarks.config import EgressBenchConfig
from benchmarks.job import Job
from benchmarks.reports.report import Report, Skipped
from benchmarks.reports.stats import percentile
from benchmarks.scenarios.measure import tlsorigin
from benchmarks.scenarios.measure.timing import measure
from pool import Backend, ConfigError, EgressControl, Sandbox, Template, load_backend
from pool.egress import EgressSettings, NetworkPolicy, Phase, summarise
from pool.results import ExecResult

PAIRS = (
    ("reset", "reset_with_network"),
    ("exec_true", "exec_true_with_proxy_env"),
    ("https_direct", "https_via_proxy"),
    ("http_direct", "http_via_proxy"),
)
METHODS = tuple(name for pair in PAIRS for name in pair)
ORIGIN = "origin.bench"
SANDBOX_HTTP_PORT, SANDBOX_HTTPS_PORT = 8080, 8443
BENCH_DIR = "/tmp/egress-bench"
TEMPLATE = Template(name="bench-egress", healthcheck="python3 -c 'import http.server, ssl'")

Outcome = list[float] | Skipped
Step = tuple[Callable[[], object], Callable[[], object]]
"""An untimed step before each iteration, and the timed operation."""


@dataclass(frozen=True, slots=True)
class EgressReport:
    """The scenario's Report, printed with the p50 each network method adds to its baseline."""

    report: Report
    added_ms: dict[str, float | None]

    def write(self, output_dir: Path) -> Path:
        """Write summary.json and samples.csv; returns the summary path."""
        return self.report.write(output_dir)

    def table(self) -> str:
        """The Report's table plus one line of added p50s."""
        added = ", ".join(f"{k} {'n/a' if v is None else f'{v:+.2f} ms'}" for k, v in self.added_ms.items())
        return f"{self.report.table()}\nadded by the proxy: {added}"


def run(job: Job) -> EgressReport:
    """Measure every method of the scenario; see the module docstring."""
    cfg: EgressBenchConfig = job.settings
    counts = {"warmup": cfg.warmup, **asdict(cfg.repetitions)}
    if any(count < 0 for count in counts.values()):
        raise ConfigError(f"benchmark.warmup and benchmark.repetitions must be >= 0, got {counts}")
    certs = tlsorigin.issue(ORIGIN)
    with tempfile.TemporaryDirectory(prefix="snapgym-bench-egress-") as tmp:
        paths = {name: Path(tmp) / name for name in ("ca.pem", "origin.crt", "origin.key")}
        for path, data in zip(paths.values(), (certs.ca_pem, certs.cert_pem, certs.key_pem), strict=True):
            path.write_bytes(data)
        origin, http_port, https_port = tlsorigin.start_host_origin(str(paths["origin.crt"]), str(paths["origin.key"]))
        try:
            egress = _egress(job, str(paths["ca.pem"]))
            backend = load_backend(job.config.backend.name, **{**job.backend_options(), "egress": egress.as_dict()})
            try:
                methods, meta = _measure(cfg, backend, certs, (http_port, https_port))
            finally:
                backend.close()
        finally:
            origin.kill()
            origin.wait()
    meta.update(_environment(cfg, backend, egress))
    added = {f"{b}_added_p50_ms": _diff(methods[a], methods[b]) for a, b in PAIRS}
    ratios = {f"{b}_vs_{a}": _ratio(methods[a], methods[b]) for a, b in PAIRS}
    return EgressReport(Report("egress", methods, ratios, meta=meta, headline=added), added)


def _egress(job: Job, ca_path: str) -> EgressSettings:
    """The configured egress settings, plus what reaches the host origin (and no upstream proxy)."""
    configured = EgressSettings.parse(job.backend_options().get("egress"))
    return EgressSettings.parse(
        {
            **configured.as_dict(),
            "hosts": {**configured.hosts, ORIGIN: "127.0.0.1"},
            "trusted_networks": [*configured.trusted_networks, "127.0.0.1/32"],
            "extra_ca_files": [*configured.extra_ca_files, ca_path],
            "upstream_proxy": None,
        }
    )


def _measure(
    cfg: EgressBenchConfig, backend: Backend, certs: tlsorigin.Certificates, host_ports: tuple[int, int]
) -> tuple[dict[str, Outcome], dict[str, Any]]:
    snapshot = backend.build(TEMPLATE)
    no_proxy = None
    if backend.capabilities.egress_control != EgressControl.PROXY:
        control = backend.capabilities.egress_control
        no_proxy = Skipped(f"the {backend.name} backend has no egress proxy here (egress_control {str(control)!r})")
    plain, net = backend.create(snapshot), backend.create(snapshot)
    try:
        reps = cfg.repetitions
        reset = (_dirty(plain), plain.restore), (_dirty(net), lambda: _restore_with_network(net))
        methods = _pair(cfg, PAIRS[0], reps.reset, *reset, no_proxy)
        if no_proxy is None:
            _set_network(net)  # the pair before may have been skipped
        execs = (_nothing, lambda: plain.exec("true")), (_nothing, lambda: net.exec("true"))
        methods |= _pair(cfg, PAIRS[1], reps.exec_true, *execs, no_proxy)
        requests, audit = _requests(cfg, net, certs, host_ports, no_proxy)
        methods |= requests
    finally:
        plain.close()
        net.close()
    return {name: methods[name] for name in METHODS}, {"snapshot": snapshot.id, "audit": audit}


def _pair(
    cfg: EgressBenchConfig,
    names: tuple[str, str],
    repetitions: int,
    first: Step,
    second: Step,
    no_proxy: Skipped | None,
) -> dict[str, Outcome]:
    """Both methods of a pair, interleaved; without a proxy the first alone and the second skipped."""
    if repetitions == 0:
        return dict.fromkeys(names, Skipped("0 repetitions configured"))
    steps = (first,) if no_proxy is not None else (first, second)
    samples: list[list[float]] = [[] for _ in steps]
    for index in range(cfg.warmup + repetitions):
        for slot in range(len(steps)) if index % 2 == 0 else reversed(range(len(steps))):
            before, operation = steps[slot]
            elapsed = measure(operation, repetitions=1, before=before)[0]
            if index >= cfg.warmup:
                samples[slot].append(elapsed)
    return {names[0]: samples[0], names[1]: no_proxy if no_proxy is not None else samples[1]}


def _requests(
    cfg: EgressBenchConfig,
    net: Sandbox,
    certs: tlsorigin.Certificates,
    host_ports: tuple[int, int],
    no_proxy: Skipped | None,
) -> tuple[dict[str, Outcome], dict[str, Any] | None]:
    """Per-request times of every request method, from one client process in ``net``."""
    names = [name for pair in PAIRS[2:] for name in pair]
    if cfg.repetitions.requests == 0:
        return dict.fromkeys(names, Skipped("0 repetitions configured")), None
    targets = _targets(cfg, net, host_ports, no_proxy)
    for name, data in (("ca.pem", certs.ca_pem), ("origin.crt", certs.cert_pem), ("origin.key", certs.key_pem)):
        net.write_file(f"{BENCH_DIR}/{name}", data)
    serve = tlsorigin.origin_command(
        f"{BENCH_DIR}/origin.crt", f"{BENCH_DIR}/origin.key", SANDBOX_HTTP_PORT, SANDBOX_HTTPS_PORT
    )
    _check(net.exec(f"({serve} </dev/null >{BENCH_DIR}/origin.log 2>&1 &)", timeout_s=30), "starting the origin")
    net.network_log()  # start the audit afresh
    client = tlsorigin.client_command(
        f"{BENCH_DIR}/ca.pem", targets, rounds=cfg.repetitions.requests, warmup=cfg.warmup
    )
    done = _check(net.exec(client, timeout_s=300), "the request client")
    samples = tlsorigin.parse_samples(done.stdout, [t.name for t in targets])
    methods: dict[str, Outcome] = {name: Skipped("plain_http is false") for name in names}
    methods.update({name: no_proxy for name in names if name.endswith("_via_proxy") and no_proxy is not None})
    methods.update(samples)
    audit = None if no_proxy is not None else summarise(net.network_log().connections)
    proxied = sum(t.proxied for t in targets)
    if audit is not None and audit["allowed"] < proxied * cfg.repetitions.requests:
        raise RuntimeError(f"the proxy's audit misses requests the client made through it: {audit}")
    return methods, audit


def _targets(
    cfg: EgressBenchConfig, net: Sandbox, host_ports: tuple[int, int], no_proxy: Skipped | None
) -> list[tlsorigin.Target]:
    http_port, https_port = host_ports
    targets = [
        tlsorigin.Target("https_direct", True, "127.0.0.1", SANDBOX_HTTPS_PORT, False, ORIGIN, SANDBOX_HTTPS_PORT)
    ]
    if cfg.plain_http:
        targets.append(
            tlsorigin.Target("http_direct", False, "127.0.0.1", SANDBOX_HTTP_PORT, False, ORIGIN, SANDBOX_HTTP_PORT)
        )
    if no_proxy is None:
        proxy = urlsplit(_set_network(net)["HTTPS_PROXY"])
        host, port = proxy.hostname or "127.0.0.1", proxy.port or 3128
        targets.append(tlsorigin.Target("https_via_proxy", True, host, port, True, ORIGIN, https_port))
        if cfg.plain_http:
            targets.append(tlsorigin.Target("http_via_proxy", False, host, port, True, ORIGIN, http_port))
    return targets


def _set_network(sandbox: Sandbox) -> dict[str, str]:
    return dict(sandbox.set_network(NetworkPolicy.public(), phase=Phase.AGENT))


def _restore_with_network(sandbox: Sandbox) -> None:
    sandbox.restore()
    sandbox.set_network(NetworkPolicy.public(), phase=Phase.AGENT)


def _dirty(sandbox: Sandbox) -> Callable[[], object]:
    return lambda: _check(sandbox.exec("echo dirty > /tmp/dirty", timeout_s=30), "dirtying the sandbox")


def _nothing() -> None:
    """The preparation of a method that needs none (``exec true`` times the exec alone)."""


def _check(result: ExecResult, what: str) -> ExecResult:
    if not result.ok:
        raise RuntimeError(f"{what} failed (exit {result.exit_code}): {result.stderr[-1000:]}")
    return result


def _p50(outcome: Outcome) -> float | None:
    return None if isinstance(outcome, Skipped) else percentile(outcome, 50)


def _diff(baseline: Outcome, other: Outcome) -> float | None:
    a, b = _p50(baseline), _p50(other)
    return None if a is None or b is None else b - a


def _ratio(baseline: Outcome, other: Outcome) -> float | None:
    a, b = _p50(baseline), _p50(other)
    return None if a is None or b is None or a == 0 else b / a


def _environment(cfg: EgressBenchConfig, backend: Backend, egress: EgressSettings) -> dict[str, Any]:
    return {
        "backend": backend.name,
        "egress": egress.as_dict(),
        "origin": {"name": ORIGIN, "body_bytes": tlsorigin.BODY_BYTES, "server": "python http.server, HTTP/1.0"},
        "host": {"platform": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version()},
        "warmup": cfg.warmup,
        "repetitions": asdict(cfg.repetitions),
        "plain_http": cfg.plain_http,
        "timer": "time.perf_counter_ns (requests: inside the sandbox's client)",
    }
