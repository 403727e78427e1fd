#!/bin/bash
# Builds /app/repo where branch "experiment" was worked on and then force-deleted, so its
# commits are reachable only through the HEAD reflog. Fixed identities and dates keep hashes
# reproducible.
set -euo pipefail
repo=$1
mkdir -p "$repo"
cd "$repo"
git init -q -b main .
export GIT_AUTHOR_NAME="Lee Park" GIT_AUTHOR_EMAIL="lee@example.com"
export GIT_COMMITTER_NAME="Lee Park" GIT_COMMITTER_EMAIL="lee@example.com"
day=10
commit() {
  day=$((day + 1))
  export GIT_AUTHOR_DATE="2024-07-${day}T14:00:00+00:00" GIT_COMMITTER_DATE="2024-07-${day}T14:00:00+00:00"
  git add -A
  git -c commit.gpgsign=false commit -q -m "$1"
}

cat > fetcher.py <<'PY'
import urllib.request


def fetch(url, timeout=10):
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.read()
PY
commit "Add fetcher"
printf '# fetcher\n\nDownloads pages for the crawler.\n' > README.md
commit "Add README"

git checkout -q -b experiment
cat >> fetcher.py <<'PY'


_cache = {}


def cached_fetch(url, timeout=10):
    if url not in _cache:
        _cache[url] = fetch(url, timeout=timeout)
    return _cache[url]
PY
commit "Add caching layer to fetcher"
cat >> fetcher.py <<'PY'


def clear_cache():
    _cache.clear()
PY
commit "Add clear_cache"
sed -i 's/^def fetch(url, timeout=10):$/def fetch(url, timeout=10):\n    print("DEBUG fetch", url)/' fetcher.py
commit "WIP: noisy debug logging"

git checkout -q main
printf 'Run `python -m pytest` before sending a patch.\n' > CONTRIBUTING.md
commit "Add contributing notes"

git checkout -q -b cache-v2
printf '\n\ndef cached_fetch(url):\n    raise NotImplementedError("caching layer v2")\n' >> fetcher.py
commit "Add caching layer to fetcher (v2 draft)"
git checkout -q main
git branch -q -D experiment cache-v2
