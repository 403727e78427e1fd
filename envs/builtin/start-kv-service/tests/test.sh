#!/bin/bash
# Talk to the running key-value server over loopback. Its data lives only in its memory,
# so a file on disk cannot stand in for it.
mkdir -p /logs/verifier
echo 0 > /logs/verifier/reward.txt
timeout 45 python3 - <<'PY'
import hashlib, os, pathlib, secrets, sys, time, urllib.error, urllib.request

BASE = "http://127.0.0.1:8080"
KV_SERVER_SHA256 = "bf39b813c67b462be60b3bbc8986f6c94e537394a0ec18953005c6170ef9025d"
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def request(method, path, body=None):
    req = urllib.request.Request(BASE + path, data=body, method=method)
    try:
        with opener.open(req, timeout=5) as resp:
            return resp.status, resp.read().decode("utf-8", "replace"), resp.headers.get("Server", "")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode("utf-8", "replace"), exc.headers.get("Server", "")


def fail(why):
    print("FAIL:", why)
    sys.exit(1)


try:
    digest = hashlib.sha256(pathlib.Path("/app/kv_server.py").read_bytes()).hexdigest()
except OSError as exc:
    fail(f"cannot read /app/kv_server.py: {exc}")
if digest != KV_SERVER_SHA256:
    fail("/app/kv_server.py was modified")

running = False
for pid in os.listdir("/proc"):
    if pid.isdigit():
        try:
            cmdline = pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        if b"kv_server.py" in cmdline:
            running = True
if not running:
    fail("no kv_server.py process is running")

health = None
for _ in range(10):
    try:
        health = request("GET", "/health")
        break
    except (OSError, urllib.error.URLError) as exc:
        last = exc
        time.sleep(0.2)
if health is None:
    fail(f"nothing answers at {BASE}: {last}")
status, body, server = health
if status != 200 or body != "ok" or not server.startswith("snapgym-kv/"):
    fail(f"/health answered {status} {body!r} (server {server!r}); is kv_server.py on port 8080?")

status, body, _ = request("GET", "/kv/greeting")
print(f"GET /kv/greeting -> {status} {body!r}")
if status != 200 or body.rstrip("\r\n") != "hello snapgym":
    fail("greeting is not 'hello snapgym'")

# The server must still work as a store: write, read back, and delete a fresh key.
key, value = f"verifier-{secrets.token_hex(4)}", secrets.token_hex(8)
status, _, _ = request("PUT", f"/kv/{key}", value.encode())
if status != 201:
    fail(f"PUT /kv/{key} answered {status}")
status, body, _ = request("GET", f"/kv/{key}")
if (status, body) != (200, value):
    fail(f"round trip of {key} failed: {status} {body!r}")
request("DELETE", f"/kv/{key}")
print("PASS")
PY
if [ $? -eq 0 ]; then
  echo 1 > /logs/verifier/reward.txt
fi
exit 0
