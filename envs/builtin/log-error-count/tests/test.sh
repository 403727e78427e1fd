#!/bin/bash
# Verifier for log-error-count. The expected count lives here, not in the sandbox, so editing
# access.log cannot change it. The answer is read the way envs/builtin/README.md says outputs are
# read: only a regular file (no symbolic link, FIFO or device), at most 64 KiB, within a time
# limit; the reward is written last, 0 or 1.
mkdir -p /logs/verifier
echo 0 > /logs/verifier/reward.txt
read_output() { [ -f "$1" ] && [ ! -L "$1" ] && timeout 5 head -c 65536 -- "$1"; }
answer=$(read_output /app/answer.txt | tr -d '[:space:]')
echo "answer: ${answer:0:200}"
if [ "$answer" = "127" ]; then reward=1; else reward=0; fi
echo "$reward" > /logs/verifier/reward.txt
exit 0
