#!/usr/bin/env bash
# A/B timing of kernel variants on the GPU machine: each variant is a `fa3` binary in
# .device/exp/NAME/ (built by scripts/ab-prep.sh); ROUNDS rounds run every variant in turn
# (so drift in clock or temperature hits all alike; each round starts one variant later, so
# no variant always runs after the same one), then cuDNN/FA2 once unless PEERS=0.
# usage: VARIANTS="base exp" [ROUNDS=2] [BENCH_ARGS=...] [PEER_ARGS=...] [LABEL=ab] scripts/ab.sh
set -uo pipefail
OUT=${OUT:-/tmp/fa3-out}
LABEL=${LABEL:-ab}
TMP=$(mktemp -d)
mkdir -p "$OUT"
status=0
read -ra vs <<< "$VARIANTS"
# Stopped (a caller's `timeout`), stop the bench too: left running, it would share the GPU
# with whatever the caller runs next. Each bench runs in the background so that the trap
# fires at once.
trap 'kill $(jobs -p) 2> /dev/null; exit 143' TERM INT
for r in $(seq "${ROUNDS:-2}"); do
  for i in $(seq 0 $((${#vs[@]} - 1))); do
    v=${vs[$(((i + r - 1) % ${#vs[@]}))]}
    timeout 300 .device/exp/"$v"/fa3 bench --dtype "${DTYPE:-f16}" --csv "$TMP/$v.r$r.csv" ${BENCH_ARGS:-} > /dev/null &
    wait $! || { echo "$v round $r failed"; status=1; }
    # The rounds so far, kept in $OUT: a call that runs past its limit still returns them.
    scripts/label-rows.sh "$TMP"/*.r*.csv > "$OUT/${LABEL}_rounds.csv"
  done
done
peers=()
if [ "${PEERS:-1}" = 1 ]; then
  timeout 300 python3 scripts/peers.py --dtype "${DTYPE:-f16}" --csv "$TMP/peers.csv" ${PEER_ARGS:-} > /dev/null 2>&1 &
  wait $! || status=1
  peers=("$TMP/peers.csv")
  cp "$TMP/peers.csv" "$OUT/${LABEL}_peers.csv"
fi
python3 scripts/ab.py "$TMP"/*.r*.csv "${peers[@]}" | tee "$OUT/${LABEL}.md"
# Every round, for the record.
scripts/label-rows.sh "$TMP"/*.r*.csv > "$OUT/${LABEL}_rounds.csv"
exit $status
