#!/usr/bin/env bash
# What cutting a rank's batch into smaller micro-batches costs on this CPU (the unit shares of
# the global batch move in, run/rebalance.h): the same images per step as one micro-batch of B
# and as K micro-batches of B / K, alternating, ROUNDS rounds. Prints images/s (spotrain bench's
# median over its timed steps) and the ratio to one micro-batch.
#
#   bench/micro_batch_cost.sh [SPOTRAIN] [ROUNDS]      (MODELS="resnet20:64 resnet50:32", CUTS="2 4")
set -euo pipefail
bin=${1:-build/spotrain}
rounds=${2:-2}
threads=${THREADS:-2}
for round in $(seq 1 "$rounds"); do
  for mb in ${MODELS:-resnet20:64 resnet50:32}; do
    model=${mb%%:*} batch=${mb##*:}
    steps=30 shape=(--image-size 28 --channels 1 --num-classes 10)  # the Fashion-MNIST model's input
    [[ $model == resnet50 ]] && steps=6 shape=()                       # ImageNet's 224 x 224 x 3
    base=
    for k in 1 ${CUTS:-2 4}; do
      micro=$((batch / k))
      json=$(mktemp)
      "$bin" bench --model "$model" --data synthetic "${shape[@]}" --batch-size "$micro" --accum-steps "$k" \
        --threads "$threads" --steps "$steps" --warmup 2 --json "$json" >/dev/null 2>&1
      ips=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['images_per_sec'])" "$json")
      rm -f "$json"
      [[ -n "$base" ]] || base=$ips
      printf 'round %d  %-9s %3d images a step as %d x %-3d  %8.2f images/s  %.3fx one micro-batch\n' \
        "$round" "$model" "$batch" "$k" "$micro" "$ips" "$(python3 -c "print($ips / $base)")"
    done
  done
done
