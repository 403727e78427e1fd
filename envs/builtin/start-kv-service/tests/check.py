"""Talk to the running key-value server over loopback; its data lives only in its memory.

This task runs in shared mode: the server is the agent's process, so nothing it says is believed
beyond what /app/kv_server.py (unmodified) would say. The process behind port 8080 must be that
script, and it must behave as that script's whole API does, not only for the greeting.
"""

import hashlib
import json
import secrets
import sys

sys.path.insert(0, "/tests")
import verifykit as vk  # noqa: E402

PORT = 8080
SCRIPT = "/app/kv_server.py"
KV_SERVER_SHA256 = "bf39b813c67b462be60b3bbc8986f6c94e537394a0ec18953005c6170ef9025d"


def call(method, path, body=None):
    status, headers, data = vk.http_request(PORT, method, path, body)
    return status, data.decode("utf-8", "replace"), headers.get("server", "")


def expect(what, got, want):
    print(f"{what} -> {got}")
    if got != want:
        raise vk.Failure(f"{what}: expected {want}, got {got}")


def keys():
    status, body, _ = call("GET", "/kv")
    try:
        listed = json.loads(body) if status == 200 else None
    except ValueError:
        listed = None
    if not isinstance(listed, list) or not all(isinstance(k, str) for k in listed) or listed != sorted(listed):
        raise vk.Failure(f"GET /kv answered {status} {body[:200]!r}, not the sorted JSON list of keys")
    return listed


def check():
    if hashlib.sha256(vk.read_output(SCRIPT)).hexdigest() != KV_SERVER_SHA256:
        raise vk.Failure(f"{SCRIPT} was modified")
    vk.require_python_service(PORT, SCRIPT)

    status, body, server = call("GET", "/health")
    if (status, body) != (200, "ok") or not server.startswith("snapgym-kv/"):
        raise vk.Failure(f"/health answered {status} {body[:200]!r} (server {server[:100]!r})")
    status, body, _ = call("GET", "/kv/greeting")
    print(f"GET /kv/greeting -> {status} {body[:200]!r}")
    if status != 200 or body.rstrip("\r\n") != "hello snapgym":
        raise vk.Failure("greeting is not 'hello snapgym'")
    if "greeting" not in keys():
        raise vk.Failure("GET /kv does not list greeting")

    # The server must still work as a store: write, list, read back, delete a fresh key.
    key, value = f"verifier-{secrets.token_hex(4)}", f"snapgym \u2713 {secrets.token_hex(8)}"
    expect(f"PUT /kv/{key}", call("PUT", f"/kv/{key}", value.encode())[0], 201)
    expect(f"GET /kv/{key}", call("GET", f"/kv/{key}")[:2], (200, value))
    if key not in keys():
        raise vk.Failure(f"GET /kv does not list {key}")
    expect(f"DELETE /kv/{key}", call("DELETE", f"/kv/{key}")[0], 204)
    expect(f"GET /kv/{key} after DELETE", call("GET", f"/kv/{key}")[0], 404)
    expect(f"DELETE /kv/{key} again", call("DELETE", f"/kv/{key}")[0], 404)
    expect("GET /kv/never-stored", call("GET", f"/kv/never-{secrets.token_hex(4)}")[0], 404)


vk.main(check, budget_s=40)
