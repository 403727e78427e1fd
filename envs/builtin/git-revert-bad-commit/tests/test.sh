#!/bin/bash
# Verifier for git-revert-bad-commit. Expected hashes are fixed: the repo is built with fixed
# identities and dates, so they never change.
mkdir -p /logs/verifier
echo 0 > /logs/verifier/reward.txt

ORIGINAL_TIP=73d5d14b7cddfc5785c50f3145e1a63e29b4edbe
BAD_COMMIT=f621507dcff94ea42a2d7e7ba98d84207333780f
EXPECTED_TREE=8e30c4832f52f3a9f4d8438387eed1ae670dfe33

fail() { echo "FAIL: $*"; exit 0; }

cd /app/repo 2>/dev/null || fail "/app/repo is missing"
export GIT_CONFIG_NOSYSTEM=1
git config --global --add safe.directory /app/repo >/dev/null 2>&1

[ "$(git symbolic-ref -q HEAD)" = "refs/heads/main" ] || fail "main is not checked out"
head=$(git rev-parse -q --verify HEAD) || fail "no HEAD"
[ "$head" != "$ORIGINAL_TIP" ] || fail "no new commit on main"
parents=$(git rev-list --parents -n 1 HEAD | wc -w)
[ "$parents" -eq 2 ] || fail "HEAD must have exactly one parent"
[ "$(git rev-parse HEAD^)" = "$ORIGINAL_TIP" ] || fail "the parent of HEAD is not the original tip of main"
git merge-base --is-ancestor "$BAD_COMMIT" HEAD || fail "history was rewritten"
[ -z "$(git status --porcelain)" ] || fail "working tree is not clean: $(git status --porcelain)"
[ "$(git rev-parse HEAD^{tree})" = "$EXPECTED_TREE" ] || {
  git diff HEAD^ HEAD
  fail "HEAD's content is not the original tip with the bad commit reverted"
}

python3 - <<'PY' || fail "behaviour check failed"
import sys
sys.path.insert(0, "/app/repo")
import inventory
items = [
    {"name": "bolt", "price": 2, "qty": 10},
    {"name": "nut", "price": 1, "qty": 3},
    {"name": "gear", "price": 7, "qty": 25},
]
assert inventory.total_value(items) == 198, inventory.total_value(items)
assert inventory.restock_plan(items) == {"bolt": 10, "nut": 17}
assert inventory.low_stock(items) == ["nut"]
PY

echo "PASS"
echo 1 > /logs/verifier/reward.txt
