#!/bin/bash
set -e
cat > /app/rotate.sh <<'SH'
#!/bin/bash
# Keep the newest N backups (by the date in the name) in /app/backups; delete the rest.
set -euo pipefail
dir=/app/backups
if [ $# -ne 1 ] || ! [[ $1 =~ ^[0-9]+$ ]] || [ $((10#$1)) -lt 1 ]; then
  echo "usage: $0 N   (N = number of backups to keep, a positive integer)" >&2
  exit 1
fi
keep=$((10#$1))
shopt -s nullglob
backups=()
for path in "$dir"/backup-[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9].tar.gz; do
  [ -f "$path" ] && [ ! -L "$path" ] && backups+=("$(basename "$path")")
done
# The names differ only in their ISO dates, so byte order is date order; newest first.
mapfile -t sorted < <(printf '%s\n' "${backups[@]+"${backups[@]}"}" | sed '/^$/d' | LC_ALL=C sort -r)
for ((i = keep; i < ${#sorted[@]}; i++)); do
  rm -f -- "$dir/${sorted[i]}"
done
SH
chmod +x /app/rotate.sh
