#!/bin/bash
# Verifier for bash-backup-rotate: fixtures and expected results live in /tests/check_rotate.py.
mkdir -p /logs/verifier
if python3 /tests/check_rotate.py; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
