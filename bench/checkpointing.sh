#!/usr/bin/env bash
# Peak memory and step time of ResNet-50 training with each gradient-checkpointing mode
# against none, in one run (same binary, same machine): the modes alternate, ROUNDS times
# (default 2), and the table gives each mode's median. Prints a markdown table.
# Usage: [ROUNDS=2] bench/checkpointing.sh [batch=64] [steps=3] [precision=fp32]
set -euo pipefail
cd "$(dirname "$0")/.."
batch=${1:-64}; steps=${2:-3}; prec=${3:-fp32}; rounds=${ROUNDS:-2}
bin=build/spotrain
modes="none selective block every:2 stage"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for r in $(seq 1 "$rounds"); do
  for mode in $modes; do
    echo "round $r/$rounds: --grad-checkpoint $mode" >&2
    "$bin" bench --model resnet50 --batch-size "$batch" --steps "$steps" --warmup 1 \
      --precision "$prec" --grad-checkpoint "$mode" --json "$tmp/$mode.$r.json" > /dev/null
  done
done
/usr/bin/python3 - "$tmp" "$batch" "$rounds" $modes <<'PY'
import json, statistics, sys
tmp, batch, rounds, modes = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
rows = {}
for m in modes:
    js = [json.load(open(f"{tmp}/{m}.{r}.json")) for r in range(1, rounds + 1)]
    ips = statistics.median(j["images_per_sec"] for j in js)
    rows[m] = (ips, batch / ips, max(j["peak_activation_bytes"] for j in js) / 2**30,
               max(j["peak_memory_bytes"] for j in js) / 2**30,
               max(j["peak_rss_bytes"] for j in js) / 2**30)
bt, bm = rows["none"][1], rows["none"][2]
print(f"| --grad-checkpoint | images/s (median of {rounds}) | step time (s) | vs none | "
      "peak activation memory (GiB) | vs none | peak tensor memory (GiB) | peak RSS (GiB) |")
print("|---|---:|---:|---:|---:|---:|---:|---:|")
for m in modes:
    ips, t, act, mem, rss = rows[m]
    print(f"| {m} | {ips:.2f} | {t:.2f} | {t / bt:.2f}x | {act:.3f} | {act / bm:.2f}x | {mem:.3f} | {rss:.3f} |")
PY
