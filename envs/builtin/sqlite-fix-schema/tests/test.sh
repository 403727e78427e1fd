#!/bin/bash
# Verifier for sqlite-fix-schema: expected rows live in /tests/expected.json, not in the sandbox.
mkdir -p /logs/verifier
if python3 /tests/check_db.py; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
