#!/bin/bash
# Verifier for implement-lru-cache: /tests/check.py plays operation scripts on /app/lru.py, as an
# untrusted user, against a reference. envs/builtin/README.md says why it is written the way it
# is. 0 goes first, so a checker that dies leaves a failing reward; check.py writes the verdict
# last, 0 or 1, from a trusted process.
mkdir -p /logs/verifier
echo 0 > /logs/verifier/reward.txt
cd / && timeout -k 5 110 python3 -I /tests/check.py
exit 0
