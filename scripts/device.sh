#!/usr/bin/env bash
# Runs on the GPU machine, from the repo root, after scripts/device-prep.sh staged .device/.
# usage: scripts/device.sh STEP...
#   info smoke tests check bench peers table sass sanitize ablation rounds bursts clocks profile
# clocks: SM clock and board power while ours and cuDNN each run one config
# (CLOCK_CONFIG, fa3 bench / peers.py arguments) for 4 s.
# rounds: ROUNDS (3) alternating rounds of bench and peers; their medians become the
# ours/peers CSVs that `table` reads.
# Env: DTYPE (f16), ALGO (fa3), BENCH_ARGS, PEER_ARGS, TESTS_FILTER.
# Results go to $OUT (default /tmp/fa3-out). Every step has a time limit so a hang
# costs minutes, not the whole call.
set -uo pipefail
B=.device/bin
OUT=${OUT:-/tmp/fa3-out}
# Only the results worth keeping go to $OUT (at most 8 files come back); the rest to $TMP.
TMP=$(mktemp -d)
DTYPE=${DTYPE:-f16}
ALGO=${ALGO:-fa3}
mkdir -p "$OUT"
status=0

for step in "$@"; do
  echo "=== $step ($(date -u +%H:%M:%S))"
  case $step in
    info) nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.draw --format=csv; $B/fa3 info ;;
    smoke)
      for d in 64 128 256; do
        timeout 60 $B/fa3 run --random 1x300x2x$d --dtype bf16 --causal --check --algo "$ALGO" 2>&1 | grep -E "check|error" || { echo "smoke d=$d FAILED"; status=1; }
      done ;;
    tests) FA3_REQUIRE_GPU=1 timeout 400 $B/gpu ${TESTS_FILTER:-} 2>&1 | tee "$OUT/gpu_tests.log" | grep -vE '^    |\.\.\. ok$' ; status=$((status | $?)) ;;
    check) timeout 120 $B/fa3 run --random 2x4096x16x128 --causal --dtype bf16 --check --algo "$ALGO" || status=1 ;;
    bench) timeout 300 $B/fa3 bench --dtype "$DTYPE" --algo "$ALGO" --csv "$OUT/ours_${ALGO}_$DTYPE.csv" ${BENCH_ARGS:-} > "$TMP/bench_${ALGO}_$DTYPE.log" || status=1; tail -n 3 "$TMP/bench_${ALGO}_$DTYPE.log" ;;
    ablation)
      # ABLATION_ROUNDS (1) rounds, each starting one variant later so that none always
      # follows the same one; the median of each config over the rounds.
      algos=(fa3 fa3-nopingpong fa3-nooverlap fa3-nows fa2)
      mkdir -p "$TMP/ablation"
      for r in $(seq "${ABLATION_ROUNDS:-1}"); do
        for i in "${!algos[@]}"; do
          a=${algos[$(((i + r - 1) % ${#algos[@]}))]}
          timeout 120 $B/fa3 bench --dtype f16 --hdims 128 --seqlens 512,1024,2048,4096,8192,16384 --algo $a --csv "$TMP/ablation/$a.r$r.csv" > /dev/null || status=1
        done
      done
      for a in "${algos[@]}"; do
        python3 scripts/median.py "$TMP/ablation_median_$a.csv" "$TMP"/ablation/$a.r*.csv >&2
      done
      scripts/label-rows.sh "$TMP"/ablation/*.csv > "$OUT/ablation_rounds.csv"
      # Against this call's peers when `peers` or `rounds` ran before it; without them the
      # table still has ours (a missing file once cost a whole ablation run).
      # The ablation kernels are fp16: compare with fp16 peers whatever DTYPE is.
      peers=()
      [ -f "$OUT/peers_f16.csv" ] && peers=("$OUT/peers_f16.csv") || echo "ablation: no peers_f16.csv in $OUT, no ratios"
      python3 scripts/compare.py "$TMP"/ablation_median_*.csv ${peers[@]+"${peers[@]}"} | tee "$OUT/ablation.md" ;;
    peers) timeout 300 python3 scripts/peers.py --dtype "$DTYPE" --csv "$OUT/peers_$DTYPE.csv" ${PEER_ARGS:-} > "$TMP/peers_$DTYPE.log" 2>&1 || status=1; tail -n 2 "$TMP/peers_$DTYPE.log" ;;
    rounds)
      for r in $(seq "${ROUNDS:-3}"); do
        timeout 300 $B/fa3 bench --dtype "$DTYPE" --algo "$ALGO" --csv "$TMP/ours_r$r.csv" ${BENCH_ARGS:-} > /dev/null || status=1
        timeout 300 python3 scripts/peers.py --dtype "$DTYPE" --csv "$TMP/peers_r$r.csv" ${PEER_ARGS:-} > /dev/null 2>&1 || status=1
      done
      # Every round's numbers, for the record (one file: $OUT keeps at most 8).
      scripts/label-rows.sh "$TMP"/ours_r*.csv "$TMP"/peers_r*.csv > "$OUT/rounds_$DTYPE.csv"
      python3 scripts/median.py "$OUT/ours_${ALGO}_$DTYPE.csv" "$TMP"/ours_r*.csv
      python3 scripts/median.py "$OUT/peers_$DTYPE.csv" "$TMP"/peers_r*.csv ;;
    bursts)
      # The anchors' (and the FA3 paper's) timing: 5 warm-ups and 20 launches after
      # BURST_COOLDOWN_MS (3000) idle, no sustained load. ROUNDS (7) rounds, each the
      # default schedule, then (BURST_PERSISTENT=1, the default) the persistent one, then
      # the peers, so each round's runs see the same card. BURST_ARGS picks the configs
      # (hdim 128 16k non-causal by default; "--causal both" for the whole grid).
      a=${BURST_ARGS:---hdims 128 --seqlens 16384 --causal off}
      a="$a --warmup-ms 0 --timing-ms 0 --cooldown-ms ${BURST_COOLDOWN_MS:-3000}"
      for r in $(seq "${ROUNDS:-7}"); do
        timeout 300 $B/fa3 bench --dtype "$DTYPE" --csv "$TMP/default.r$r.csv" $a > /dev/null || status=1
        if [ "${BURST_PERSISTENT:-1}" = 1 ]; then
          timeout 300 $B/fa3 bench --dtype "$DTYPE" --csv "$TMP/persistent.r$r.csv" --schedule persistent $a > /dev/null || status=1
        fi
        timeout 400 python3 scripts/peers.py --dtype "$DTYPE" --csv "$TMP/peers.r$r.csv" $a > /dev/null 2>&1 || status=1
      done
      scripts/label-rows.sh "$TMP"/*.r*.csv > "$OUT/bursts_rounds_$DTYPE.csv"
      python3 scripts/median.py "$TMP/bursts_ours.csv" "$TMP"/default.r*.csv
      python3 scripts/median.py "$TMP/bursts_peers.csv" "$TMP"/peers.r*.csv
      python3 scripts/compare.py "$TMP/bursts_ours.csv" "$TMP/bursts_peers.csv" | tee "$OUT/bursts_table_$DTYPE.md"
      if [ "${BURST_PERSISTENT:-1}" = 1 ]; then
        python3 scripts/ab.py "$TMP"/default.r*.csv "$TMP"/persistent.r*.csv "$TMP"/peers.r*.csv | tee "$OUT/bursts_ab_$DTYPE.md"
      fi ;;
    table) python3 scripts/compare.py "$OUT"/ours_*_"$DTYPE".csv "$OUT/peers_$DTYPE.csv" | tee "$OUT/table_$DTYPE.md" ;;
    sass)
      $B/fa3 ptx > "$TMP/kernels.ptx"
      ptxas -arch=sm_90a -v "$TMP/kernels.ptx" -o /tmp/k.cubin > "$OUT/ptxas.log" 2>&1
      grep -E "warning" "$OUT/ptxas.log"
      cuobjdump -sass /tmp/k.cubin > /tmp/k.sass
      for f in $(grep -oE "Function : [a-z0-9_]+" /tmp/k.sass | awk '{print $3}'); do
        awk -v f="$f" '/Function : /{p=($3==f)} p' /tmp/k.sass > /tmp/one.sass
        regs=$(grep -A2 "Function properties for $f\$" "$OUT/ptxas.log" | grep -oE "Used [0-9]+ registers" | grep -oE "[0-9]+")
        printf "%-32s regs %3s HGMMA %4d HMMA %4d USETMAXREG %d UTMALDG %d UTMASTG %d LDL %d STL %d\n" "$f" "$regs" \
          "$(grep -c HGMMA /tmp/one.sass)" "$(grep -c 'HMMA' /tmp/one.sass)" "$(grep -c USETMAXREG /tmp/one.sass)" \
          "$(grep -c UTMALDG /tmp/one.sass)" "$(grep -c UTMASTG /tmp/one.sass)" "$(grep -c 'LDL' /tmp/one.sass)" "$(grep -c 'STL' /tmp/one.sass)"
      done | tee "$OUT/sass_summary.txt" ;;
    sanitize)
      # memcheck, racecheck and synccheck on 14 cases each, 8 runs at a time, with the
      # default algorithm unless a case names one (ALGO is not used here):
      # causal 1x200x2 (one tile per CTA) and 1x256x70 (140 tiles > 132 SMs: the counter,
      # in sections of 2 heads) at hdim 64, 128, 256; hdim 64 without a mask at 1x1100x2
      # (warpgroups past the end skip their rows) and 1x1100x24 (144 tiles: the counter
      # for a short last block); hdim 128 1x300x2 without a mask; the 2-CTA multicast
      # kernel; hdim 128 without pingpong, and the no-overlap ablation (Q in registers,
      # rotated loop). The causal cases of 200 rows start their first tile before row 0,
      # and 1x17x2x128 causal has a warpgroup wholly before it. hdim 256 runs its 64-key
      # kernel up to 4096 keys, its 80-key one on 4200.
      B=$B OUT=$OUT scripts/sanitize.sh "1x200x2x64 --causal" "1x256x70x64 --causal" "1x1100x2x64" "1x1100x24x64" \
        "1x200x2x128 --causal" "1x256x70x128 --causal" "1x300x2x128" "1x200x2x256 --causal" \
        "1x256x70x256 --causal" "1x300x4x128 --heads-k 2 --schedule multicast" \
        "1x300x2x128 --algo fa3-nopingpong" "1x300x2x128 --causal --algo fa3-nooverlap" \
        "1x17x2x128 --causal" "1x100x2x256 --seqlen-k 4200 --causal" || status=1 ;;
    profile)
      # ncu on one config, ours (the single launch of `fa3 run`) and cuDNN's kernel (the
      # first launch from peers.py), at the clocks the card chooses (one launch is far from
      # the power cap: compare per-cycle figures, not times). PROFILE_SHAPE: BxSxHxD on the
      # FA3 grid (B = 16384 / S, H = 2048 / D), which is what peers.py runs;
      # PROFILE_CAUSAL=1 for the causal mask.
      shape=${PROFILE_SHAPE:-1x16384x16x128}
      ours_mask=() peer_mask=off
      [ "${PROFILE_CAUSAL:-0}" = 1 ] && ours_mask=(--causal) peer_mask=on
      IFS=x read -r pb ps ph pd <<< "$shape"
      if [ "$((pb * ps))" != 16384 ] || [ "$((ph * pd))" != 2048 ]; then
        echo "profile: $shape is off the FA3 grid (B*S = 16384, H*D = 2048); cuDNN would run another shape"
        status=1; continue
      fi
      # Elapsed cycles and the spread of active cycles over SMs tell per-tile cost from
      # the tail (an SM idle at the end lowers .min and .avg, not .max).
      m=gpc__cycles_elapsed.max,sm__cycles_active.min,sm__cycles_active.max,gpu__time_duration.sum
      m=$m,sm__cycles_active.avg,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active
      m=$m,smsp__inst_executed.sum,smsp__issue_active.avg.pct_of_peak_sustained_active
      m=$m,sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active,sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active
      m=$m,sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active,lts__t_sector_hit_rate.pct,lts__t_bytes.sum
      m=$m,dram__bytes_read.sum,smsp__average_warps_issue_stalled_wait_per_issue_active.ratio
      m=$m,smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio,smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio
      m=$m,smsp__average_warps_issue_stalled_gmma_per_issue_active.ratio,smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio
      timeout 120 ncu --clock-control none --metrics "$m" --section InstructionStats -k regex:fa3_fwd --launch-count 1 \
        $B/fa3 run --random "$shape" --dtype "$DTYPE" ${ours_mask[@]+"${ours_mask[@]}"} > "$OUT/ncu_ours.txt" 2>&1 || status=1
      timeout 240 ncu --clock-control none --metrics "$m" --section InstructionStats -k regex:cudnn --launch-count 1 \
        python3 scripts/peers.py --dtype "$DTYPE" --backends torch-cudnn --hdims "$pd" --seqlens "$ps" --causal "$peer_mask" \
        --warmup 0 --warmup-ms 1 --iters 1 --timing-ms 1 --csv "$TMP/profile_peers.csv" > "$OUT/ncu_cudnn.txt" 2>&1 || status=1
      grep -E "Profiling|cycles_elapsed|cycles_active|duration|hmma|inst_executed.sum |issue_active|hit_rate|lts__t_bytes|dram__bytes" "$OUT"/ncu_*.txt ;;
    clocks)
      cfg=${CLOCK_CONFIG:---hdims 128 --seqlens 4096 --causal off}
      (while true; do echo "$(date +%s.%N),$(nvidia-smi --query-gpu=clocks.sm,power.draw --format=csv,noheader,nounits)"; sleep 0.1; done) > "$TMP/smi.csv" &
      sampler=$!
      echo "ours,$(date +%s.%N)" > "$TMP/marks.csv"
      timeout 60 $B/fa3 bench $cfg --warmup-ms 4000 --csv "$TMP/clk_ours.csv" > /dev/null || status=1
      echo "idle,$(date +%s.%N)" >> "$TMP/marks.csv"
      sleep 3
      echo "cudnn,$(date +%s.%N)" >> "$TMP/marks.csv"
      timeout 120 python3 scripts/peers.py --backends torch-cudnn $cfg --warmup-ms 4000 --csv "$TMP/clk_cudnn.csv" > /dev/null 2>&1 || status=1
      echo "end,$(date +%s.%N)" >> "$TMP/marks.csv"
      kill $sampler
      python3 - "$TMP/marks.csv" "$TMP/smi.csv" "$TMP/clk_ours.csv" "$TMP/clk_cudnn.csv" <<'PY' | tee "$OUT/clocks.txt"
import csv, statistics, sys
marks = [(n, float(t)) for n, t in csv.reader(open(sys.argv[1]))]
smi = [(float(t), float(c), float(p)) for t, c, p in csv.reader(open(sys.argv[2])) if p.strip()[0].isdigit()]
tf = {r["impl"]: r["tflops"] for f in sys.argv[3:] for r in csv.DictReader(open(f))}
for (name, t0), (_, t1) in zip(marks, marks[1:]):
    # The loaded steady state: the last 3 s of the 4 s run (torch's start-up comes before).
    s = [x for x in smi if max(t0, t1 - 3.2) <= x[0] <= t1 - 0.2]
    if s:
        print(f"{name:6} {len(s):3} samples: SM clock median {statistics.median(x[1] for x in s):.0f} MHz, power median {statistics.median(x[2] for x in s):.0f} W")
print("TFLOP/s:", tf)
PY
      ;;
    *) echo "unknown step $step"; status=1 ;;
  esac
done
exit $status
