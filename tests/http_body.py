"""The body of an HTTP/1.1 request, as the stand-in servers read it: by Content-Length, or chunked
(connectrpc and some SDK uploads stream requests chunked, which BaseHTTPRequestHandler does not
decode). Reading every body to its end keeps keep-alive connections in step."""

from __future__ import annotations

from http.server import BaseHTTPRequestHandler


def read_body(handler: BaseHTTPRequestHandler) -> bytes:
    """The request's whole body, de-chunked, trailers skipped."""
    if "chunked" not in handler.headers.get("Transfer-Encoding", "").lower():
        return handler.rfile.read(int(handler.headers.get("Content-Length") or 0))
    chunks = []
    while size := int(handler.rfile.readline(1024).split(b";")[0].strip() or b"0", 16):
        chunks.append(handler.rfile.read(size))
        handler.rfile.readline(1024)
    while handler.rfile.readline(1024).strip():  # trailers, up to the blank line
        continue
    return b"".join(chunks)
