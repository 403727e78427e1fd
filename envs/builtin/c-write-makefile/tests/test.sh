#!/bin/bash
# Verifier for c-write-makefile: checks the build, the program's output, incremental rebuilds
# (using fixed old timestamps, so the one-second mtime resolution never matters) and clean.
mkdir -p /logs/verifier
echo 0 > /logs/verifier/reward.txt
fail() { echo "FAIL: $*"; exit 0; }

cd /app || fail "no /app"
[ -f /app/Makefile ] || fail "/app/Makefile is missing"
sha256sum --quiet -c /tests/sources.sha256 || fail "source files were modified"
OBJS="main.o lexer.o eval.o"
SRCS="main.c lexer.c eval.c calc.h"
mtime() { stat -c %Y "$1" 2>/dev/null || echo missing; }
OLD_SRC=$(date -d '2020-01-01 00:00:00' +%s)
OLD_OBJ=$(date -d '2021-01-01 00:00:00' +%s)
age_all() {  # sources oldest, then objects, then the binary: everything up to date
  touch -d '2020-01-01 00:00:00' $SRCS
  touch -d '2021-01-01 00:00:00' $OBJS
  touch -d '2021-06-01 00:00:00' calc
}
rebuilt() { [ "$(mtime "$1")" != missing ] && [ "$(mtime "$1")" -gt "$OLD_OBJ" ]; }
kept() { [ "$(mtime "$1")" = "$OLD_OBJ" ]; }

# 1. Clean build from scratch.
make clean >/tmp/make.log 2>&1 || { cat /tmp/make.log; fail "make clean failed"; }
rm -f calc $OBJS
make >/tmp/make.log 2>&1 || { cat /tmp/make.log; fail "make failed"; }
[ -x calc ] || fail "make did not produce /app/calc"
for o in $OBJS; do [ -f "$o" ] || fail "make did not produce /app/$o"; done

# 2. The program works.
check() {
  local got
  got=$(timeout 5 ./calc "$1" 2>/dev/null)
  [ $? -eq 0 ] && [ "$got" = "$2" ] || fail "calc '$1' printed '$got', expected '$2'"
}
check "2 + 3 * 4" 14
check "2 ^ 10" 1024
check "(1 + 2) * -3" -9
check "7 / 2" 3.5
check "2 ^ 0.5" 1.414213562
check "2 ^ 3 ^ 2" 512
check "1.5e3 + .25" 1500.25
timeout 5 ./calc "2 +" >/dev/null 2>&1 && fail "calc accepted an invalid expression"

# 3. Nothing changed: nothing is rebuilt.
age_all
make >/tmp/make.log 2>&1 || { cat /tmp/make.log; fail "second make failed"; }
for o in $OBJS; do kept "$o" || fail "$o was rebuilt although nothing changed"; done
[ "$(mtime calc)" = "$(date -d '2021-06-01 00:00:00' +%s)" ] || fail "calc was relinked although nothing changed"

# 4. One .c changed: only its object is recompiled, calc relinked.
age_all
touch eval.c
make >/tmp/make.log 2>&1 || { cat /tmp/make.log; fail "make after touching eval.c failed"; }
rebuilt eval.o || fail "eval.o was not recompiled after eval.c changed"
kept main.o || fail "main.o was recompiled although only eval.c changed"
kept lexer.o || fail "lexer.o was recompiled although only eval.c changed"
rebuilt calc || fail "calc was not relinked after eval.c changed"

# 5. The header changed: every object is recompiled.
age_all
touch calc.h
make >/tmp/make.log 2>&1 || { cat /tmp/make.log; fail "make after touching calc.h failed"; }
for o in $OBJS; do rebuilt "$o" || fail "$o was not recompiled after calc.h changed"; done
rebuilt calc || fail "calc was not relinked after calc.h changed"
check "2 ^ 10" 1024

# 6. make clean removes the outputs and nothing else.
make clean >/tmp/make.log 2>&1 || { cat /tmp/make.log; fail "make clean failed"; }
for f in calc $OBJS; do [ ! -e "$f" ] || fail "make clean left $f"; done
sha256sum --quiet -c /tests/sources.sha256 || fail "make clean removed or changed sources"
[ -f Makefile ] || fail "make clean removed the Makefile"

echo "PASS"
echo 1 > /logs/verifier/reward.txt
