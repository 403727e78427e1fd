#!/bin/bash
# Verifier for top-ips. The expected answer lives here, not in the sandbox, so editing access.log
# cannot change it. The answer is read the way envs/builtin/README.md says outputs are read: only
# a regular file (no symbolic link, FIFO or device), at most 64 KiB, within a time limit; the
# reward is written last, 0 or 1.
mkdir -p /logs/verifier
echo 0 > /logs/verifier/reward.txt
read_output() { [ -f "$1" ] && [ ! -L "$1" ] && timeout 5 head -c 65536 -- "$1"; }
expected=$'203.0.113.42\n198.51.100.7\n192.0.2.199'
# Ignore surrounding whitespace on each line and blank lines (e.g. a trailing newline).
actual="$(read_output /app/top_ips.txt | sed -e 's/^[[:space:]]*//' -e 's/[[:space:]]*$//' | grep -v '^$')"
echo "expected:"; echo "$expected"; echo "actual:"; echo "${actual:0:2000}"
if [ "$actual" = "$expected" ]; then reward=1; else reward=0; fi
echo "$reward" > /logs/verifier/reward.txt
exit 0
