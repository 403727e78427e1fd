#!/bin/bash
# Builds /app/repo: six commits with fixed identities and dates, so the hashes are reproducible.
set -euo pipefail
repo=$1
mkdir -p "$repo"
cd "$repo"
git init -q -b main .
export GIT_AUTHOR_NAME="Dana Reyes" GIT_AUTHOR_EMAIL="dana@example.com"
export GIT_COMMITTER_NAME="Dana Reyes" GIT_COMMITTER_EMAIL="dana@example.com"
n=0
commit() {
  n=$((n + 1))
  export GIT_AUTHOR_DATE="2024-03-0${n}T10:00:00+00:00" GIT_COMMITTER_DATE="2024-03-0${n}T10:00:00+00:00"
  git add -A
  git -c commit.gpgsign=false commit -q -m "$1"
}

cat > inventory.py <<'PY'
"""Small helpers for the warehouse inventory report."""


def total_value(items):
    """Sum of price * qty over all items."""
    total = 0
    for item in items:
        total += item["price"] * item["qty"]
    return total


def low_stock(items, threshold=5):
    """Names of items whose quantity is below the threshold."""
    return [item["name"] for item in items if item["qty"] < threshold]
PY
commit "Add inventory helpers"

cat > README.md <<'MD'
# inventory

Helpers used by the nightly warehouse report.
MD
commit "Add README"

python3 - <<'PY'
import re
src = open("inventory.py").read()
src = src.replace('''    total = 0
    for item in items:
        total += item["price"] * item["qty"]
    return total''', '''    total = 0
    for item in items[1:]:
        total += item["price"] * item["qty"]
    return round(total, 2)''')
open("inventory.py", "w").write(src)
PY
commit "Speed up total_value loop"

cat >> inventory.py <<'PY'


def restock_plan(items, target=20):
    """Map item name -> how many units to order to reach the target quantity."""
    return {item["name"]: target - item["qty"] for item in items if item["qty"] < target}
PY
commit "Add restock_plan helper"

cat >> README.md <<'MD'

## Functions

- `total_value(items)`: value of the stock on hand
- `low_stock(items, threshold=5)`: items that are running out
- `restock_plan(items, target=20)`: how much to order
MD
commit "Document helpers in README"
