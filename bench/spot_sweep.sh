#!/usr/bin/env bash
# Goodput (and work goodput: spot_sim.py's steps at full size) against the checkpoint interval: bench/spot_sim.py over fixed --ckpt-every values and
# auto, at several host MTBFs, the same failure process (seed) for every interval. Hard kills
# only (--grace 0): with a notice, the stop checkpoint saves everything and the interval hardly
# matters. Prints one table row per run; the JSON lines go to OUT (default spot_sweep.jsonl).
#   [SEEDS="1 2 3"] bench/spot_sweep.sh ["MTBFS"] ["INTERVALS"] [extra spot_sim.py arguments...]
# SEEDS: failure processes to run each cell under (default 1); a run sees only a few failures,
# so compare means over seeds. RECOVERIES: spot_sim.py's --recovery values to run each cell
# under, e.g. "today survivors" (default today). JOB: the job's spot_sim.py arguments (default
# ResNet-18 on synthetic data, batch 8, 200 steps).
# default MTBFS "20 40 80" (seconds per host), INTERVALS "5 20 auto" (steps or auto)
set -euo pipefail
cd "$(dirname "$0")/.."
mtbfs=${1:-20 40 80}
intervals=${2:-5 20 auto}
shift $(($# > 2 ? 2 : $#))
out=${OUT:-spot_sweep.jsonl}
job=${JOB:-"--model resnet18 --data synthetic --batch-size 8 --steps 200 --train-args='--train-limit 100000 --lr 0.001'"}
printf '%-9s %-6s %-9s %-5s %7s %7s %9s %12s %9s %8s %10s %s\n' recovery mtbf interval seed goodput work wall_s preemptions lost_s lost_st kill2step bitwise
for seed in ${SEEDS:-1}; do
for m in $mtbfs; do
  for i in $intervals; do
    for rec in ${RECOVERIES:-today}; do
      if ! line=$(eval python3 bench/spot_sim.py --recovery "$rec" --mtbf "$m" --grace 0 --ckpt-every "$i" \
                    --json "$out" --seed "$seed" "$job" '"$@"' | tail -1); then
        # A run whose job failed (e.g. every copy of its checkpoints lost): counted, not hidden.
        printf '%-9s %-6s %-9s %-5s the job failed: %s\n' "$rec" "$m" "$i" "$seed" "$line"
        echo "{\"recovery\": \"$rec\", \"mtbf_s\": $m, \"ckpt_every\": \"$i\", \"seed\": $seed, \"failed\": true}" >> "$out"
        continue
      fi
      python3 -c 'import json,sys; r=json.loads(sys.argv[1]); k=r.get("kill_to_first_step_s"); print("%-9s %-6g %-9s %-5d %7.3f %7.3f %9.1f %12d %9.2f %8.2f %10s %s" % (
        r["recovery"], r["mtbf_s"], r["ckpt_every"], r["seed"], r["goodput"], r["work_goodput"], r["wall_s"], r["preemptions"], r["lost_s"],
        r["lost_steps_per_preemption"], "%.1f" % k if k is not None else "-", r.get("bitwise_equal", "-")))' "$line"
    done
  done
done
done
