# Sourced by the GPU machine's run scripts: strict pipes, the staged binaries ($B), the
# results folder ($OUT, default /tmp/fa3-out), a scratch folder ($TMP), status 0.
set -uo pipefail
B=${B:-.device/bin}
OUT=${OUT:-/tmp/fa3-out}
TMP=$(mktemp -d)
mkdir -p "$OUT"
status=0
