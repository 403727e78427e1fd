#!/bin/bash
set -e
cd /app/repo
# The deleted branch's commits are still in HEAD's reflog.
sha=$(git log -g --format='%H%x09%s' HEAD | awk -F'\t' '$2 == "Add caching layer to fetcher" { print $1; exit }')
test -n "$sha"
git branch recovered "$sha"
