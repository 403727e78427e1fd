#!/bin/bash
# Verifier for sqlite-top-customers. The expected answer is fixed here, not read from the database.
# The answer is read the way envs/builtin/README.md says outputs are read: only a regular file (no
# symbolic link, FIFO or device), at most 64 KiB, within a time limit; the reward is written last.
mkdir -p /logs/verifier
echo 0 > /logs/verifier/reward.txt
read_output() { [ -f "$1" ] && [ ! -L "$1" ] && timeout 5 head -c 65536 -- "$1"; }
expected=$'Farah Haddad\nChen Wei\nJulia Novak'
# Tolerate trailing spaces, CRLF and trailing newlines; nothing else.
got=$(read_output /app/top.txt | sed -e 's/[[:space:]]*$//')
if [ "$got" = "$expected" ]; then
  echo "PASS"
  reward=1
else
  echo "FAIL: expected:"; echo "$expected"; echo "got:"; printf '%s\n' "${got:0:2000}"
  reward=0
fi
echo "$reward" > /logs/verifier/reward.txt
exit 0
