#!/bin/bash
# The expected answer lives here, not in the sandbox, so editing access.log cannot change it.
mkdir -p /logs/verifier
expected=$'203.0.113.42\n198.51.100.7\n192.0.2.199'
if [ -f /app/top_ips.txt ]; then
  # Ignore surrounding whitespace on each line and blank lines (e.g. a trailing newline).
  actual="$(sed -e 's/^[[:space:]]*//' -e 's/[[:space:]]*$//' /app/top_ips.txt | grep -v '^$')"
else
  actual=""
fi
echo "expected:"; echo "$expected"; echo "actual:"; echo "$actual"
if [ "$actual" = "$expected" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
exit 0
