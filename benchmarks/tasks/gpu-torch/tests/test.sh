#!/bin/bash
# The verifier computes the answer on the GPU itself (so a sandbox without a working CUDA device
# cannot pass) and compares the agent's number with it.
set -u
mkdir -p /logs/verifier
python3 - <<'PY'
import pathlib
import sys

import torch

reward = pathlib.Path("/logs/verifier/reward.txt")
if not torch.cuda.is_available():
    print("FAIL: no CUDA device in this sandbox")
    reward.write_text("0\n")
    sys.exit(0)
a = torch.arange(4096, dtype=torch.float64, device="cuda").reshape(64, 64) / 4096
expected = float((a @ a @ a).trace())
try:
    got = float(pathlib.Path("/app/trace.txt").read_text().strip())
except (OSError, ValueError) as exc:
    print(f"FAIL: /app/trace.txt: {exc}")
    reward.write_text("0\n")
    sys.exit(0)
ok = abs(got - expected) <= 1e-6 * abs(expected)
print(("PASS" if ok else "FAIL"), got, expected, torch.cuda.get_device_name(0))
reward.write_text("1\n" if ok else "0\n")
PY
