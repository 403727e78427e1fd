#!/bin/bash
# Builds /app/repo with branches main and feature that both edit CHANGELOG.md.
# Fixed identities and dates keep the commit hashes reproducible.
set -euo pipefail
repo=$1
mkdir -p "$repo"
cd "$repo"
git init -q -b main .
export GIT_AUTHOR_NAME="Sam Okafor" GIT_AUTHOR_EMAIL="sam@example.com"
export GIT_COMMITTER_NAME="Sam Okafor" GIT_COMMITTER_EMAIL="sam@example.com"
day=0
commit() {
  day=$((day + 1))
  export GIT_AUTHOR_DATE="2024-05-1${day}T09:30:00+00:00" GIT_COMMITTER_DATE="2024-05-1${day}T09:30:00+00:00"
  git add -A
  git -c commit.gpgsign=false commit -q -m "$1"
}

cat > CHANGELOG.md <<'MD'
# Changelog

## Unreleased

- Nothing yet.

## 1.2.0

- Add --quiet flag.
- Read settings from ~/.greetrc.
MD
cat > greet.py <<'PY'
import sys


def greet(name):
    return "Hello, " + name + "!"


def main(argv):
    quiet = "--quiet" in argv
    names = [a for a in argv if not a.startswith("--")]
    for name in names:
        if not quiet:
            print(greet(name))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
PY
commit "Release 1.2.0"

git checkout -q -b feature
cat > formats.py <<'PY'
import json


def as_json(greetings):
    return json.dumps({"greetings": greetings}, sort_keys=True)
PY
commit "Add JSON formatter"
sed -i 's/^- Nothing yet\.$/- Add --json output flag./' CHANGELOG.md
commit "Note --json in changelog"

git checkout -q main
sed -i 's/^    names = \[a for a in argv if not a.startswith("--")\]$/    names = [a for a in argv if a and not a.startswith("--")]/' greet.py
sed -i 's/^- Nothing yet\.$/- Fix crash on empty input./' CHANGELOG.md
commit "Skip empty names"
