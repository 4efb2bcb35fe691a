#!/usr/bin/env bash
# Every round's rows in one CSV (the device run returns at most 8 files): each data row
# of each FILE.csv, prefixed with FILE (its name less the directory and `.csv`).
# usage: scripts/label-rows.sh FILE.csv...
set -euo pipefail
for f in "$@"; do
  awk -v v="$(basename "$f" .csv)" 'NR > 1 { print v "," $0 }' "$f"
done
