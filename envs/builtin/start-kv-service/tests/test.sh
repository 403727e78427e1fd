#!/bin/bash
# Verifier for start-kv-service: /tests/check.py checks the key-value server the agent left
# running. envs/builtin/README.md says why it is written the way it is. 0 goes first, so a checker
# that dies leaves a failing reward; check.py writes the verdict last, 0 or 1, from a trusted
# process.
mkdir -p /logs/verifier
echo 0 > /logs/verifier/reward.txt
cd / && timeout -k 5 50 python3 -I /tests/check.py
exit 0
