#!/bin/bash
# Run the hidden copy of the tests (plus extra cases) against /app/stats.py.
# /app/test_stats.py is not used, so editing it does not help.
mkdir -p /logs/verifier
echo 0 > /logs/verifier/reward.txt
rm -rf /tmp/verify_stats && mkdir -p /tmp/verify_stats
cp /tests/hidden_test_stats.py /tmp/verify_stats/hidden_test_stats.py
cd /tmp/verify_stats || exit 0
set -o pipefail
if PYTHONPATH=/app PYTHONDONTWRITEBYTECODE=1 timeout 60 python3 -m unittest -v hidden_test_stats 2>&1 | tee /tmp/verify_stats/out.txt \
   && grep -q '^OK' /tmp/verify_stats/out.txt && ! grep -q '^Ran 0 tests' /tmp/verify_stats/out.txt; then
  echo 1 > /logs/verifier/reward.txt
fi
exit 0
