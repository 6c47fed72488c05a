#!/usr/bin/env bash
# Large global batches on the CPU (docs/RECIPES.md, "Large batches on Fashion-MNIST"): ResNet-20
# on Fashion-MNIST for EPOCHS epochs (default 6), the test top-1 of each run:
#   ref       batch 128, SGD (the recipe's settings: lr 0.2 per 256, Nesterov, cosine)
#   sgd-4k    global batch 4,096, SGD with the linear rule (lr 0.1 per 256 = 1.6, as Goyal et al.) and warm-up
#   lars-4k   global batch 4,096, LARS (trust 0.001), poly decay power 2, warm-up
#   ranks-4   the LARS run as 4 MPI ranks x 1,024, 1 thread each
#   accum-4   the LARS run as 1 rank x 1,024 x --accum-steps 4, 1 thread (the same images in
#             each micro-batch as on each rank above, batch norm per micro-batch, the running
#             statistics of the first as of rank 0: the same result up to the all-reduce's
#             summation order)
# Prints a markdown table. RUNS picks some of them (default all five, e.g. RUNS="ref lars-4k").
# Usage: [EPOCHS=6] [LARS_LR=10] [RUNS=...] bench/large_batch.sh [OUT=bench-out/large-batch]
set -euo pipefail
cd "$(dirname "$0")/.."
epochs=${EPOCHS:-6}; lars_lr=${LARS_LR:-10}
out=${1:-bench-out/large-batch}
bin=$PWD/build/spotrain
mkdir -p "$out"
common=(--model resnet20 --data fashion-mnist --epochs "$epochs" --label-smoothing 0.1 --weight-decay 0.0005
        --momentum 0.9 --seed 1 --log-every 1000 --keep 1)
lars=(--optimizer lars --lars-trust 0.001 --lr "$lars_lr" --lr-schedule poly --lr-poly-power 2 --lr-end 0.0001
      --warmup-epochs 2)
runs=" ${RUNS:-ref sgd-4k lars-4k ranks-4 accum-4} "
run() {  # run NAME ARGS...
  local name=$1; shift
  [[ "$runs" == *" $name "* ]] || return 0
  echo "== $name: spotrain train $*" >&2
  local t0=$SECONDS
  "$@" --ckpt-dir "$out/$name" --new-run > "$out/$name.log" 2>&1 || { echo "$name failed: see $out/$name.log" >&2; return 1; }
  echo "$name $((SECONDS - t0))" >> "$out/seconds.txt"
}
rm -f "$out/seconds.txt"
run ref "$bin" train "${common[@]}" --threads 2 --batch-size 128 --lr-per-256 0.2 --nesterov --warmup-epochs 1 --lr-schedule cosine
run sgd-4k "$bin" train "${common[@]}" --threads 2 --batch-size 4096 --lr-per-256 0.1 --nesterov --warmup-epochs 2 --lr-schedule cosine
run lars-4k "$bin" train "${common[@]}" --threads 2 --batch-size 4096 "${lars[@]}"
run ranks-4 env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun --oversubscribe -np 4 \
  "$bin" train "${common[@]}" --threads 1 --batch-size 1024 "${lars[@]}"
run accum-4 "$bin" train "${common[@]}" --threads 1 --batch-size 1024 --accum-steps 4 "${lars[@]}"
/usr/bin/python3 - "$out" "$epochs" "$runs" <<'PY'
import json, sys
out, epochs, runs = sys.argv[1], sys.argv[2], sys.argv[3].split()
secs = dict(l.split() for l in open(f"{out}/seconds.txt"))
rows = [("ref", "128 (1 x 128)", "SGD"), ("sgd-4k", "4,096 (1 x 4,096)", "SGD, linear rule"),
        ("lars-4k", "4,096 (1 x 4,096)", "LARS"), ("ranks-4", "4,096 (4 ranks x 1,024)", "LARS"),
        ("accum-4", "4,096 (1 x 1,024 x 4)", "LARS, accumulation")]
print(f"| run | global batch | optimizer | test top-1 after {epochs} epochs | wall (s) |")
print("|---|---|---|---:|---:|")
top = {}
for name, batch, opt in rows:
    if name not in runs:
        continue
    last = None
    for line in open(f"{out}/{name}/metrics.jsonl"):
        r = json.loads(line)
        if r.get("type") == "epoch" and "test_top1" in r:
            last = r["test_top1"]
    top[name] = last
    print(f"| {name} | {batch} | {opt} | {100 * last:.2f}% | {secs.get(name, '?')} |")
if "ranks-4" in top and "accum-4" in top:
    print(f"\nranks-4 against accum-4: {100 * abs(top['ranks-4'] - top['accum-4']):.2f} points apart")
PY
