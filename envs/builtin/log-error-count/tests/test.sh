#!/bin/bash
# The expected count lives here, not in the sandbox, so editing access.log cannot change it.
mkdir -p /logs/verifier
if [ -f /app/answer.txt ] && [ "$(tr -d '[:space:]' < /app/answer.txt)" = "127" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
