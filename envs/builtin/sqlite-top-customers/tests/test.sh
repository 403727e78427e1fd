#!/bin/bash
# Verifier for sqlite-top-customers. The expected answer is fixed here, not read from the database.
mkdir -p /logs/verifier
expected=$'Farah Haddad\nChen Wei\nJulia Novak'
if [ -f /app/top.txt ]; then
  # Tolerate trailing spaces, CRLF and trailing newlines; nothing else.
  got=$(sed -e 's/[[:space:]]*$//' /app/top.txt)
else
  got=""
fi
if [ "$got" = "$expected" ]; then
  echo "PASS"
  echo 1 > /logs/verifier/reward.txt
else
  echo "FAIL: expected:"; echo "$expected"; echo "got:"; printf '%s\n' "$got"
  echo 0 > /logs/verifier/reward.txt
fi
