#!/bin/bash
# Verifier for git-resolve-merge-conflict. The repo is built with fixed identities and dates,
# so the branch tips and the expected merge tree are fixed hashes.
mkdir -p /logs/verifier
echo 0 > /logs/verifier/reward.txt

MAIN_TIP=b9cdabc3dc81a5ece72454501bbe9caf3d448377
FEATURE_TIP=fd3c8346f3f78f674a6b1fa2cd9aeac917d8322c
EXPECTED_TREE=22a7a2873420dc5a097d763ea6340fa8ec41bc49
GREET_BLOB=9c5be176b7491bd6a81eca859d8dc2ad96dc5085     # main's greet.py
FORMATS_BLOB=b53522706b329add23045a4dcd660688ea2ca7ad   # feature's formats.py

fail() { echo "FAIL: $*"; exit 0; }

cd /app/repo 2>/dev/null || fail "/app/repo is missing"
export GIT_CONFIG_NOSYSTEM=1
git config --global --add safe.directory /app/repo >/dev/null 2>&1

[ "$(git symbolic-ref -q HEAD)" = "refs/heads/main" ] || fail "main is not checked out"
[ ! -e .git/MERGE_HEAD ] || fail "the merge is still in progress"
read -r _ p1 p2 extra <<<"$(git rev-list --parents -n 1 HEAD)"
[ -n "$p2" ] && [ -z "$extra" ] || fail "HEAD is not a merge commit with two parents"
[ "$p1" = "$MAIN_TIP" ] || fail "first parent of the merge is not the old tip of main"
[ "$p2" = "$FEATURE_TIP" ] || fail "second parent of the merge is not the tip of feature"

git show HEAD:CHANGELOG.md > /tmp/changelog.committed 2>/dev/null || fail "CHANGELOG.md not committed"
diff -u /tests/expected_CHANGELOG.md /tmp/changelog.committed || fail "committed CHANGELOG.md is not as specified"
[ "$(git rev-parse HEAD:greet.py 2>/dev/null)" = "$GREET_BLOB" ] || fail "main's change to greet.py was lost"
[ "$(git rev-parse HEAD:formats.py 2>/dev/null)" = "$FORMATS_BLOB" ] || fail "feature's formats.py was lost"
if git grep -n -E '^(<<<<<<<|=======|>>>>>>>)' HEAD -- . ; then fail "conflict markers remain"; fi
[ -z "$(git status --porcelain --untracked-files=all)" ] || fail "working tree not clean: $(git status --porcelain --untracked-files=all)"
[ "$(git rev-parse HEAD^{tree})" = "$EXPECTED_TREE" ] || { git diff --stat "$MAIN_TIP" HEAD; fail "the merge result holds other changes"; }

echo "PASS"
echo 1 > /logs/verifier/reward.txt
