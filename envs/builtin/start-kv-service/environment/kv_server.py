"""A small in-memory key-value store served over HTTP.

Usage: python3 kv_server.py --port PORT [--host HOST]

API (values are UTF-8 text, stored only in this process's memory):

    GET    /health      -> 200 "ok"
    GET    /kv          -> 200 JSON array of the stored keys, sorted
    GET    /kv/<key>    -> 200 the value, or 404 when the key is not stored
    PUT    /kv/<key>    -> 201; the request body is the new value
    DELETE /kv/<key>    -> 204, or 404 when the key is not stored
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote

MAX_VALUE_BYTES = 1 << 20

_store: dict[str, str] = {}
_lock = threading.Lock()


class Handler(BaseHTTPRequestHandler):
    server_version = "snapgym-kv/1.0"

    def _reply(self, status: int, body: str = "", content_type: str = "text/plain; charset=utf-8") -> None:
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _key(self) -> str | None:
        path = self.path.split("?", 1)[0]
        if not path.startswith("/kv/") or len(path) == len("/kv/"):
            return None
        return unquote(path[len("/kv/") :])

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/health":
            self._reply(200, "ok")
            return
        if path in ("/kv", "/kv/"):
            with _lock:
                keys = sorted(_store)
            self._reply(200, json.dumps(keys), "application/json")
            return
        key = self._key()
        if key is None:
            self._reply(404, "not found\n")
            return
        with _lock:
            value = _store.get(key)
        if value is None:
            self._reply(404, f"no such key: {key}\n")
        else:
            self._reply(200, value)

    def do_PUT(self) -> None:
        key = self._key()
        if key is None:
            self._reply(404, "use PUT /kv/<key>\n")
            return
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_VALUE_BYTES:
            self._reply(413, "value too large\n")
            return
        raw = self.rfile.read(length) if length else b""
        try:
            value = raw.decode("utf-8")
        except UnicodeDecodeError:
            self._reply(400, "value must be UTF-8 text\n")
            return
        with _lock:
            _store[key] = value
        self._reply(201, "stored\n")

    def do_DELETE(self) -> None:
        key = self._key()
        with _lock:
            found = key is not None and _store.pop(key, None) is not None
        if found:
            self._reply(204)
        else:
            self._reply(404, "no such key\n")

    def log_message(self, format: str, *args: object) -> None:
        sys.stderr.write(f"kv_server: {self.address_string()} {format % args}\n")


def main() -> None:
    parser = argparse.ArgumentParser(description="In-memory key-value store over HTTP.")
    parser.add_argument("--port", type=int, required=True, help="TCP port to listen on")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    args = parser.parse_args()
    server = ThreadingHTTPServer((args.host, args.port), Handler)
    print(f"kv_server: listening on {args.host}:{args.port}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
