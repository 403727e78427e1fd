"""Inventory service: a tiny HTTP service configured by /app/service.env.

The configuration file holds KEY=VALUE lines; blank lines and lines starting with '#'
are ignored. Settings:

    SERVICE_NAME   name reported by /info (default: "service")
    SERVICE_HOST   address to bind, e.g. 127.0.0.1 or 0.0.0.0 (required)
    SERVICE_PORT   TCP port to listen on, 1-65535 (required)

Endpoints:

    GET /health -> 200 "ok"
    GET /info   -> 200 JSON {"service": ..., "host": ..., "port": ...}

Run it with:  python3 /app/service.py
"""

from __future__ import annotations

import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

CONFIG_PATH = Path("/app/service.env")


def load_config(path: Path) -> dict[str, str]:
    config: dict[str, str] = {}
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if "=" not in line:
            sys.exit(f"error: {path}:{number}: expected KEY=VALUE, got {raw!r}")
        key, value = line.split("=", 1)
        config[key.strip()] = value.strip()
    return config


def main() -> None:
    config = load_config(CONFIG_PATH)
    for required in ("SERVICE_HOST", "SERVICE_PORT"):
        if not config.get(required):
            sys.exit(f"error: {required} is not set in {CONFIG_PATH}")
    name = config.get("SERVICE_NAME", "service")
    host = config["SERVICE_HOST"]
    try:
        port = int(config["SERVICE_PORT"])
    except ValueError:
        sys.exit(f"error: SERVICE_PORT must be a number, got {config['SERVICE_PORT']!r}")
    if not 1 <= port <= 65535:
        sys.exit(f"error: SERVICE_PORT {port} is out of range")
    info = json.dumps({"service": name, "host": host, "port": port})

    class Handler(BaseHTTPRequestHandler):
        server_version = f"{name}/1.0"

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/health":
                self._reply(200, "ok", "text/plain; charset=utf-8")
            elif path == "/info":
                self._reply(200, info, "application/json")
            else:
                self._reply(404, "not found\n", "text/plain; charset=utf-8")

        def _reply(self, status: int, body: str, content_type: str) -> None:
            data = body.encode()
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: object) -> None:
            sys.stderr.write(f"{name}: {self.address_string()} {format % args}\n")

    server = ThreadingHTTPServer((host, port), Handler)
    print(f"{name}: listening on {host}:{port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
