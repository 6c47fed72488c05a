#!/usr/bin/env bash
# What watching the ranks for stragglers costs (docs/PERFORMANCE.md, "Straggler detection"):
# the same training run on RANKS MPI ranks with the per-rank times gathered at every progress
# line (the default) and without (SPOTRAIN_NO_RANK_WATCH=1), alternating (each first in every
# other round), ROUNDS rounds; per
# run the median step time over its progress windows (the first left out), and the ratio of
# each round's pair. --log-every 10 gathers five times as often as the default 50: an upper
# bound. Usage: [RANKS=2] [ROUNDS=3] [STEPS=300] bench/straggler_overhead.sh [OUT=bench-out/straggler]
set -euo pipefail
cd "$(dirname "$0")/.."
ranks=${RANKS:-2}; rounds=${ROUNDS:-3}; steps=${STEPS:-300}
out=${1:-bench-out/straggler}
bin=$PWD/build/spotrain
mkdir -p "$out"
args=(train --model resnet20 --data synthetic --batch-size 64 --steps "$steps" --log-every 10 --threads 1
      --eval-every 0 --keep 1 --new-run)
median_step() {  # the median step_seconds of a run's progress records, the first left out
  /usr/bin/python3 - "$1/metrics.jsonl" <<'PY'
import json, statistics, sys
s = [json.loads(l) for l in open(sys.argv[1])]
v = [r["step_seconds"] for r in s if r.get("type") == "step"][1:]
print("%.5f" % statistics.median(v))
PY
}
echo "| round | watched s/step | not watched s/step | watched / not |"
echo "|---|---|---|---|"
for ((r = 1; r <= rounds; r++)); do
  order="on off"; ((r % 2)) || order="off on"  # each goes first in every other round
  for mode in $order; do
    hook=0; [[ $mode == off ]] && hook=1
    env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 SPOTRAIN_NO_RANK_WATCH=$hook \
      mpirun --oversubscribe -np "$ranks" -x SPOTRAIN_NO_RANK_WATCH "$bin" "${args[@]}" \
      --ckpt-dir "$out/$mode" > "$out/$mode.log" 2>&1 || { echo "failed: see $out/$mode.log" >&2; exit 1; }
    declare "s_$mode=$(median_step "$out/$mode")"
  done
  # shellcheck disable=SC2154
  echo "| $r | $s_on | $s_off | $(/usr/bin/python3 -c "print('%.4f' % ($s_on / $s_off))") |"
done
