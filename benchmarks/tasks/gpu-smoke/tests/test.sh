#!/bin/bash
# The GPU is there now (the verifier asks the driver itself), the agent's list matches it, and, where
# PyTorch is installed, a CUDA kernel runs.
set -u
fail() { echo "FAIL: $*"; echo 0 > /logs/verifier/reward.txt; exit 0; }
command -v nvidia-smi >/dev/null || fail "nvidia-smi is missing: no GPU driver in this sandbox"
nvidia-smi -L > /tmp/expected.txt 2>&1 || fail "nvidia-smi -L failed: $(cat /tmp/expected.txt)"
[ -s /tmp/expected.txt ] || fail "no GPU listed"
diff -q /tmp/expected.txt /app/gpus.txt >/dev/null 2>&1 || fail "/app/gpus.txt does not list the GPUs"
if python3 -c "import torch" 2>/dev/null; then
  python3 -c "import torch; x = torch.ones(1024, device='cuda'); assert float((x * 2).sum()) == 2048.0" \
    || fail "a CUDA kernel did not run"
fi
echo PASS
echo 1 > /logs/verifier/reward.txt
