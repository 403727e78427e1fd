#!/bin/bash
# Check the running service over loopback, and that the fix is in the configuration file.
mkdir -p /logs/verifier
echo 0 > /logs/verifier/reward.txt
timeout 45 python3 - <<'PY'
import hashlib, json, os, pathlib, sys, time, urllib.error, urllib.request

BASE = "http://127.0.0.1:9090"
SERVICE_SHA256 = "281f5586de0e4a51cd7d4b42ae381fe9636fc661422e6a5ccc9f47d94342af00"
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def fail(why):
    print("FAIL:", why)
    sys.exit(1)


def get(path):
    with opener.open(BASE + path, timeout=5) as resp:
        return resp.status, resp.read().decode("utf-8", "replace")


try:
    digest = hashlib.sha256(pathlib.Path("/app/service.py").read_bytes()).hexdigest()
except OSError as exc:
    fail(f"cannot read /app/service.py: {exc}")
if digest != SERVICE_SHA256:
    fail("/app/service.py was modified")

# The configuration file itself must carry the fix (parsed the way service.py parses it).
config = {}
try:
    for line in pathlib.Path("/app/service.env").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            key, value = line.split("=", 1)
            config[key.strip()] = value.strip()
except OSError as exc:
    fail(f"cannot read /app/service.env: {exc}")
print("service.env:", config)
if config.get("SERVICE_PORT") != "9090":
    fail("SERVICE_PORT in /app/service.env is not 9090")
if config.get("SERVICE_NAME") != "inventory":
    fail("SERVICE_NAME in /app/service.env is not inventory")
if config.get("SERVICE_HOST") not in ("127.0.0.1", "0.0.0.0", "localhost"):
    fail(f"SERVICE_HOST {config.get('SERVICE_HOST')!r} is not reachable over 127.0.0.1")

running = False
for pid in os.listdir("/proc"):
    if pid.isdigit():
        try:
            cmdline = pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        if b"service.py" in cmdline:
            running = True
if not running:
    fail("no service.py process is running")

result, last = None, None
for _ in range(10):
    try:
        result = get("/health")
        break
    except (OSError, urllib.error.URLError) as exc:
        last = exc
        time.sleep(0.2)
if result is None:
    fail(f"nothing answers at {BASE}: {last}")
print("GET /health ->", result)
if result != (200, "ok"):
    fail("/health did not return ok")

try:
    status, body = get("/info")
    info = json.loads(body)
except (OSError, urllib.error.URLError, ValueError) as exc:
    fail(f"/info failed: {exc}")
print("GET /info ->", info)
if info.get("service") != "inventory" or info.get("port") != 9090:
    fail("the process on port 9090 is not the inventory service configured for port 9090")
print("PASS")
PY
if [ $? -eq 0 ]; then
  echo 1 > /logs/verifier/reward.txt
fi
exit 0
