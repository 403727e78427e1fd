#!/bin/bash
# Verifier for git-recover-deleted-branch. The repo is built with fixed identities and dates,
# so the lost commit and main's tip are fixed hashes.
mkdir -p /logs/verifier
echo 0 > /logs/verifier/reward.txt

EXPECTED=5d6fec857d0aee4d3986d36bf1dbc33911fc443a     # "Add caching layer to fetcher" on experiment
MAIN_TIP=742dc65aeeb5dcb9e0f97b1abe17fef53bbe3ae6

fail() { echo "FAIL: $*"; exit 0; }

cd /app/repo 2>/dev/null || fail "/app/repo is missing"
export GIT_CONFIG_NOSYSTEM=1
git config --global --add safe.directory /app/repo >/dev/null 2>&1

got=$(git rev-parse -q --verify refs/heads/recovered) || fail "branch recovered does not exist"
[ "$got" = "$EXPECTED" ] || fail "recovered points at $got ($(git log -1 --format=%s "$got")), not the lost commit"
[ "$(git log -1 --format=%s recovered)" = "Add caching layer to fetcher" ] || fail "wrong commit message"
[ "$(git rev-parse refs/heads/main)" = "$MAIN_TIP" ] || fail "main was moved"
[ "$(git symbolic-ref -q HEAD)" = "refs/heads/main" ] || fail "main is not checked out"
[ -z "$(git status --porcelain)" ] || fail "working tree not clean"

echo "PASS"
echo 1 > /logs/verifier/reward.txt
