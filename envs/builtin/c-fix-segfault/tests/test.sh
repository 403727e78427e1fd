#!/bin/bash
# Verifier for c-fix-segfault: builds with the task's make, then runs the binary (and an
# AddressSanitizer build of the same source) on the inputs in /tests/inputs, comparing with
# the outputs in /tests/expected.
mkdir -p /logs/verifier
echo 0 > /logs/verifier/reward.txt
fail() { echo "FAIL: $*"; exit 0; }

cd /app || fail "no /app"
rm -f /app/wordcount
make >/tmp/make.log 2>&1 || { cat /tmp/make.log; fail "make failed"; }
[ -x /app/wordcount ] || fail "make did not produce /app/wordcount"
gcc -fsanitize=address -fno-omit-frame-pointer -g -O1 -o /tmp/wordcount_asan /app/wordcount.c \
  >/tmp/asan_build.log 2>&1 || { cat /tmp/asan_build.log; fail "wordcount.c does not build with -fsanitize=address"; }
export ASAN_OPTIONS=detect_leaks=0

for bin in /app/wordcount /tmp/wordcount_asan; do
  for input in /tests/inputs/*; do
    name=$(basename "$input")
    timeout 10 "$bin" "$input" >/tmp/out 2>/tmp/err
    rc=$?
    [ $rc -eq 0 ] || { head -c 2000 /tmp/err; fail "$bin $name exited with status $rc"; }
    cmp -s /tmp/out "/tests/expected/$name.out" || {
      diff <(head -c 400 "/tests/expected/$name.out") <(head -c 400 /tmp/out)
      fail "$bin $name: wrong output"
    }
  done

  timeout 10 "$bin" /nonexistent/input.txt >/tmp/out 2>/tmp/err
  rc=$?
  [ $rc -eq 1 ] || fail "$bin on a missing file exited with $rc, expected 1"
  [ ! -s /tmp/out ] || fail "$bin on a missing file printed to stdout"
  [ -s /tmp/err ] || fail "$bin on a missing file printed no error to stderr"
  grep -q AddressSanitizer /tmp/err && fail "$bin: AddressSanitizer report on a missing file"

  timeout 10 "$bin" >/tmp/out 2>/tmp/err
  rc=$?
  [ $rc -eq 2 ] || fail "$bin without arguments exited with $rc, expected 2"
  [ -s /tmp/err ] || fail "$bin without arguments printed no usage message"
  timeout 10 "$bin" /tests/inputs/basic.txt /tests/inputs/tie.txt >/tmp/out 2>/tmp/err
  rc=$?
  [ $rc -eq 2 ] || fail "$bin with two arguments exited with $rc, expected 2"
done

echo "PASS"
echo 1 > /logs/verifier/reward.txt
