#!/usr/bin/env bash
# An A/B variant that is the staged CLI (.device/bin/fa3, scripts/device-prep.sh) with
# extra arguments: .device/exp/NAME/fa3 becomes a wrapper that appends them, for
# scripts/ab.sh. usage: scripts/ab-prep-flag.sh NAME ARG...   e.g. untracked --untracked
set -euo pipefail
cd "$(dirname "$0")/.."
name=$1
shift
mkdir -p .device/exp/"$name"
{
  echo '#!/bin/sh'
  extra=""
  [ $# -gt 0 ] && extra=$(printf ' %q' "$@")
  echo "exec \"\$(dirname \"\$0\")/../../bin/fa3\" \"\$@\"$extra"
} > .device/exp/"$name"/fa3
chmod +x .device/exp/"$name"/fa3
echo "built .device/exp/$name/fa3: .device/bin/fa3 ... $*"
