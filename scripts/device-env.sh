# Sourced by the GPU machine's run scripts: strict pipes, the staged binaries ($B), the
# results folder ($OUT, default /tmp/fa3-out), a scratch folder ($TMP), status 0.
set -uo pipefail
B=${B:-.device/bin}
OUT=${OUT:-/tmp/fa3-out}
TMP=$(mktemp -d)
mkdir -p "$OUT"
status=0

# Unpacks the A/B builds carried in .device/ab.tgz (`tar czf .device/ab.tgz -C .device exp`,
# built by scripts/ab-prep.sh) into .device/exp, and names the GPU.
unpack_exp() {
  tar xzf .device/ab.tgz -C .device
  nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
}
