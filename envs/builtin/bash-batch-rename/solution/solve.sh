#!/bin/bash
set -e
cd /app/photos
shopt -s nullglob
for f in IMG_*.JPG; do
  [[ -f $f && $f =~ ^IMG_([0-9]+)\.JPG$ ]] || continue
  n=$((10#${BASH_REMATCH[1]}))   # base 10: "08" is eight, not an invalid octal number
  mv -n -- "$f" "$(printf 'photo-%04d.jpg' "$n")"
done
