#!/bin/bash
# Run the hidden tests in /tests against /app/kvparse.py.
mkdir -p /logs/verifier
echo 0 > /logs/verifier/reward.txt
rm -rf /tmp/verify_kvparse && mkdir -p /tmp/verify_kvparse
cp /tests/test_kvparse.py /tmp/verify_kvparse/hidden_test_kvparse.py
cd /tmp/verify_kvparse || exit 0
set -o pipefail
if PYTHONPATH=/app PYTHONDONTWRITEBYTECODE=1 timeout 60 python3 -m unittest -v hidden_test_kvparse 2>&1 | tee out.txt \
   && grep -q '^OK' out.txt && ! grep -q '^Ran 0 tests' out.txt; then
  echo 1 > /logs/verifier/reward.txt
fi
exit 0
