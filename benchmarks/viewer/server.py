"""The viewer's HTTP server: two static pages, the JSON they poll, and the run's raw files.

Routes (GET only):

- ``/`` and ``/episode``: the index and episode pages (``static/index.html`` and ``static/episode.html``, each
  the body of a page, in ``static/page.html``, the head they share), and ``/static/<name>`` (scripts, styles).
- ``/api/run``: state, headline, counts, summary, plots (``RunReader.run``).
- ``/api/episodes``: the episode table's rows; ``/api/episode?id=<episode_id>``: one episode.
- ``/files/<path>``: a file of the run directory, checked by ``RunFiles``: text as ``text/plain``, PNG
  as an image, anything else as a download.

Every response says ``X-Content-Type-Options: nosniff`` and carries a
Content-Security-Policy: the pages may load scripts, styles, images and JSON
from this server only (no inline script, so text an agent wrote cannot run
even if it reached the DOM as HTML), and raw files are sandboxed. On a
loopback address the server answers only requests whose ``Host`` is a
loopback name, so a web page cannot reach it through DNS rebinding.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import math
import shutil
import threading
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from benchmarks.viewer.access import RefusedPathError, content_type
from benchmarks.viewer.reader import RunReader

PAGE_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
FILE_POLICY = "default-src 'none'; img-src 'self'; sandbox"
STATIC_TYPES = {".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8"}
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]")

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Page:
    """One of the viewer's pages: ``static/<name>.html`` (its body) and ``static/<name>.js`` in ``static/page.html``."""

    name: str
    title: str

    def render(self, static: Traversable) -> bytes:
        """The whole page, read afresh (no build step: the files are the source)."""
        shell = (static / "page.html").read_text(encoding="utf-8")
        body = (static / f"{self.name}.html").read_text(encoding="utf-8")
        return shell.replace("{title}", self.title).replace("{name}", self.name).replace("{body}", body).encode()


_INDEX, _EPISODE = Page("index", "snapgym run"), Page("episode", "snapgym episode")
PAGES = {"/": _INDEX, "/index.html": _INDEX, "/episode": _EPISODE, "/episode.html": _EPISODE}


class Viewer:
    """A run's viewer, serving on ``host:port`` (port 0: any free port) until closed.

    Raises:
        NotARunDirError: ``run_dir`` is not a run directory.
        OSError: the address cannot be bound (the port is taken).
    """

    def __init__(self, run_dir: Path, *, host: str = "127.0.0.1", port: int = 8765) -> None:
        self.reader = RunReader(run_dir)
        allowed = _allowed_hosts(host)
        self.is_loopback = allowed is not None
        """Whether it listens on a loopback address only (then it answers to loopback host names only)."""
        self._httpd = ThreadingHTTPServer((host, port), _handler(self.reader, allowed))
        self._httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """Where the index page is."""
        host, port = self._httpd.server_address[:2]
        shown = str(host)
        if ":" in shown:
            shown = f"[{shown}]"
        elif shown == "0.0.0.0":
            shown = "127.0.0.1"
        return f"http://{shown}:{port}/"

    def serve_forever(self) -> None:
        """Serve until :meth:`close` (from another thread) or an interrupt."""
        self._httpd.serve_forever(poll_interval=0.2)

    def start(self) -> Viewer:
        """Serve from a daemon thread; returns self."""
        self._thread = threading.Thread(target=self.serve_forever, name="snapgym-viewer", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop serving and free the port. Idempotent."""
        if self._thread is not None:
            self._httpd.shutdown()
            self._thread.join()
            self._thread = None
        self._httpd.server_close()

    def __enter__(self) -> Viewer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _allowed_hosts(host: str) -> frozenset[str] | None:
    """Host names the server answers to: loopback ones when it listens on loopback; None: any."""
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host == "localhost"
    return frozenset(LOOPBACK_NAMES) if loopback else None


def _handler(reader: RunReader, allowed_hosts: frozenset[str] | None) -> type[BaseHTTPRequestHandler]:
    static = resources.files("benchmarks.viewer") / "static"

    class Handler(BaseHTTPRequestHandler):
        def version_string(self) -> str:
            return "snapgym-viewer"

        def do_GET(self) -> None:
            if allowed_hosts is not None and _host_name(self.headers.get("Host", "").lower()) not in allowed_hosts:
                self._text(HTTPStatus.MISDIRECTED_REQUEST, "this viewer answers on localhost only")
                return
            url = urlsplit(self.path)
            path = unquote(url.path)
            query = {key: values[0] for key, values in parse_qs(url.query).items()}
            try:
                self._route(path, query)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the browser left mid-reply (a reload, a closed tab): nobody to answer
            except Exception:  # a bug, not a hostile file: say so, keep serving
                log.exception("viewer: %s failed", self.path)
                self._text(HTTPStatus.INTERNAL_SERVER_ERROR, "the viewer failed on this request; see its log")

        def _route(self, path: str, query: dict[str, str]) -> None:
            if path == "/favicon.ico":
                self._send(HTTPStatus.NO_CONTENT, b"", "image/x-icon")
            elif path in PAGES:
                self._send(HTTPStatus.OK, PAGES[path].render(static), "text/html; charset=utf-8", cache="no-cache")
            elif path.startswith("/static/"):
                self._static(path.removeprefix("/static/"))
            elif path == "/api/run":
                self._json(reader.run())
            elif path == "/api/episodes":
                self._json({"episodes": reader.episodes()})
            elif path == "/api/episode":
                episode = reader.episode(query.get("id", ""))
                if episode is None:
                    self._json({"error": "no result for this episode (yet)"}, HTTPStatus.NOT_FOUND)
                else:
                    self._json(episode)
            elif path.startswith("/files/"):
                self._file(path.removeprefix("/files/"))
            else:
                self._text(HTTPStatus.NOT_FOUND, "no such page")

        def _static(self, name: str) -> None:
            item = static / name
            if "/" in name or Path(name).suffix not in STATIC_TYPES or not item.is_file():
                self._text(HTTPStatus.NOT_FOUND, "no such page")
                return
            self._send(HTTPStatus.OK, item.read_bytes(), STATIC_TYPES[Path(name).suffix], cache="no-cache")

        def _file(self, relative: str) -> None:
            kind = content_type(relative)
            try:
                with reader.files.open(relative) as (file, size):
                    self.send_response(HTTPStatus.OK)
                    self._headers(kind or "application/octet-stream", size, policy=FILE_POLICY, cache="no-cache")
                    if kind is None:
                        self.send_header("Content-Disposition", "attachment")
                    self.end_headers()
                    shutil.copyfileobj(file, self.wfile)
            except RefusedPathError as exc:
                self._text(HTTPStatus.FORBIDDEN, str(exc))
            except FileNotFoundError:
                self._text(HTTPStatus.NOT_FOUND, f"no file {relative!r} in the run directory")

        def _json(self, document: Any, status: HTTPStatus = HTTPStatus.OK) -> None:
            body = json.dumps(_finite(document), default=str, allow_nan=False).encode()
            self._send(status, body, "application/json")

        def _text(self, status: HTTPStatus, message: str) -> None:
            self._send(status, (message + "\n").encode(), "text/plain; charset=utf-8", policy=FILE_POLICY)

        def _send(
            self, status: HTTPStatus, body: bytes, kind: str, *, policy: str = PAGE_POLICY, cache: str = "no-store"
        ) -> None:
            self.send_response(status)
            self._headers(kind, len(body), policy=policy, cache=cache)
            self.end_headers()
            self.wfile.write(body)

        def _headers(self, kind: str, length: int, *, policy: str, cache: str) -> None:
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(length))
            self.send_header("Content-Security-Policy", policy)
            self.send_header("X-Content-Type-Options", "nosniff")
            self.send_header("X-Frame-Options", "DENY")
            self.send_header("Referrer-Policy", "no-referrer")
            self.send_header("Cache-Control", cache)

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("viewer: " + format, *args)

    return Handler


def _host_name(header: str) -> str:
    """The host part of a ``Host`` header (``[::1]:8765`` -> ``[::1]``)."""
    if header.startswith("["):
        return header.split("]", 1)[0] + "]"
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


def _finite(value: Any) -> Any:
    """``value`` with NaN and infinities as null (JSON has neither; summary.json may hold a NaN)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(item) for item in value]
    return value
