#!/bin/bash
# Run the hidden tests in /tests against /app/lru.py.
mkdir -p /logs/verifier
echo 0 > /logs/verifier/reward.txt
rm -rf /tmp/verify_lru && mkdir -p /tmp/verify_lru
cp /tests/test_lru.py /tmp/verify_lru/hidden_test_lru.py
cd /tmp/verify_lru || exit 0
set -o pipefail
if PYTHONPATH=/app PYTHONDONTWRITEBYTECODE=1 timeout 90 python3 -m unittest -v hidden_test_lru 2>&1 | tee out.txt \
   && grep -q '^OK' out.txt && ! grep -q '^Ran 0 tests' out.txt; then
  echo 1 > /logs/verifier/reward.txt
fi
exit 0
