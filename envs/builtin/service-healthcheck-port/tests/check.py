"""Check the running service over loopback, and that the fix is in the configuration file.

This task runs in shared mode: the service is the agent's process, so nothing it says is believed
beyond what /app/service.py (unmodified), configured by /app/service.env, would say. The process
behind port 9090 must be that script.
"""

import hashlib
import json
import sys

sys.path.insert(0, "/tests")
import verifykit as vk  # noqa: E402

PORT = 9090
SCRIPT = "/app/service.py"
SERVICE_SHA256 = "281f5586de0e4a51cd7d4b42ae381fe9636fc661422e6a5ccc9f47d94342af00"


def config():
    """/app/service.env, parsed the way service.py parses it."""
    settings = {}
    for line in vk.read_text("/app/service.env", max_bytes=64 * 1024).splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            key, value = line.split("=", 1)
            settings[key.strip()] = value.strip()
    return settings


def get(path):
    status, headers, data = vk.http_request(PORT, "GET", path)
    return status, data.decode("utf-8", "replace"), headers.get("server", "")


def check():
    if hashlib.sha256(vk.read_output(SCRIPT)).hexdigest() != SERVICE_SHA256:
        raise vk.Failure(f"{SCRIPT} was modified")
    settings = config()
    print("service.env:", settings)
    if settings.get("SERVICE_PORT") != "9090":
        raise vk.Failure("SERVICE_PORT in /app/service.env is not 9090")
    if settings.get("SERVICE_NAME") != "inventory":
        raise vk.Failure("SERVICE_NAME in /app/service.env is not inventory")
    if settings.get("SERVICE_HOST") not in ("127.0.0.1", "0.0.0.0", "localhost"):
        raise vk.Failure(f"SERVICE_HOST {settings.get('SERVICE_HOST')!r} is not reachable over 127.0.0.1")

    vk.require_python_service(PORT, SCRIPT)

    status, body, server = get("/health")
    print("GET /health ->", status, repr(body[:200]))
    if (status, body) != (200, "ok") or not server.startswith("inventory/"):
        raise vk.Failure(f"/health answered {status} {body[:200]!r} (server {server[:100]!r})")
    status, body, _ = get("/info")
    try:
        info = json.loads(body) if status == 200 else None
    except ValueError:
        info = None
    print("GET /info ->", status, repr(body[:200]))
    want = {"service": "inventory", "host": settings["SERVICE_HOST"], "port": 9090}
    if info != want:
        raise vk.Failure(f"/info is not {want}: the process on port 9090 is not the inventory service configured "
                         "for port 9090")  # fmt: skip
    if get("/nonexistent")[0] != 404:
        raise vk.Failure("the service answers paths it does not serve")


vk.main(check, budget_s=40)
