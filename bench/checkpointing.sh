#!/usr/bin/env bash
# Peak memory and step time of ResNet-50 training with each gradient-checkpointing mode
# against none, in one run (same binary, same machine). Prints a markdown table.
# Usage: bench/checkpointing.sh [batch=64] [steps=3] [precision=fp32]
set -euo pipefail
cd "$(dirname "$0")/.."
batch=${1:-64}; steps=${2:-3}; prec=${3:-fp32}
bin=build/spotrain
tmp=$(mktemp -d)
echo "| --grad-checkpoint | images/s | step time (s) | vs none | peak activation memory (GiB) | vs none | peak tensor memory (GiB) | peak RSS (GiB) |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|"
base_t=""; base_m=""
for mode in none block every:2 stage; do
  "$bin" bench --model resnet50 --batch-size "$batch" --steps "$steps" --warmup 1 \
    --precision "$prec" --grad-checkpoint "$mode" --json "$tmp/$mode.json" >&2
  /usr/bin/python3 - "$tmp/$mode.json" "$mode" "$batch" "${base_t:-0}" "${base_m:-0}" <<'PY'
import json, sys
j = json.load(open(sys.argv[1])); mode = sys.argv[2]; batch = int(sys.argv[3])
bt, bm = float(sys.argv[4]), float(sys.argv[5])
t = batch / j["images_per_sec"]; m = j["peak_activation_bytes"] / 2**30
rt = f"{t / bt:.2f}x" if bt else "1.00x"; rm = f"{m / bm:.2f}x" if bm else "1.00x"
print(f"| {mode} | {j['images_per_sec']:.2f} | {t:.2f} | {rt} | {m:.3f} | {rm} | {j['peak_memory_bytes'] / 2**30:.3f} | {j['peak_rss_bytes'] / 2**30:.3f} |")
open(sys.argv[1] + ".base", "w").write(f"{t} {m}\n")
PY
  if [[ -z "$base_t" ]]; then read -r base_t base_m < "$tmp/none.json.base"; fi
done
rm -rf "$tmp"
