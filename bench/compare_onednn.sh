#!/usr/bin/env bash
# spotrain on Debian's oneDNN 2.6 (build/) against the same code on oneDNN 3.x from PyPI
# (build-onednn3/, scripts/build-onednn3.sh), alternating, ROUNDS rounds: ResNet-50 batch 32,
# fp32 and bf16, on this processor's own instruction set and with oneDNN held to AVX2
# (ONEDNN_MAX_CPU_ISA, which both versions obey: an AVX2 machine's kernels and layouts).
# Prints a markdown table of images/s and peak RSS with the ratio 3.x / 2.6 per row.
set -euo pipefail
cd "$(dirname "$0")/.."
old=${OLD:-build/spotrain} new=${NEW:-build-onednn3/spotrain}
for b in "$old" "$new"; do [[ -x $b ]] || { echo "compare_onednn.sh: error: $b is not built" >&2; exit 1; }; done
rounds=${ROUNDS:-2} steps=${STEPS:-4} warmup=${WARMUP:-2} threads=${THREADS:-$(nproc)}
model_args=${MODEL_ARGS:---model resnet50 --batch-size 32}
isas=${ISAS:-native avx2}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
run() {  # binary isa precision -> "images/s rss_gib" (median images/s, peak RSS)
  local env=(OMP_NUM_THREADS="$threads")
  [[ $2 == avx2 ]] && env+=(ONEDNN_MAX_CPU_ISA=AVX2 DNNL_MAX_CPU_ISA=AVX2)
  env "${env[@]}" "$1" bench $model_args --threads "$threads" --steps "$steps" --warmup "$warmup" \
    --precision "$3" --json "$tmp/r.json" >&2
  python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); print("%.2f %.2f" % (j["images_per_sec"], j["peak_rss_bytes"] / 2**30))' "$tmp/r.json"
}
echo "<!-- bench/compare_onednn.sh, $(date +%F): $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | xargs), $threads threads, $model_args, $steps timed steps after $warmup, median; $("$old" --version | head -1 | cut -d' ' -f1-2) -->"
echo "| round | ISA | precision | oneDNN 2.6 img/s | oneDNN 3.x img/s | 3.x / 2.6 | 2.6 peak RSS (GiB) | 3.x peak RSS (GiB) |"
echo "|---:|---|---|---:|---:|---:|---:|---:|"
for r in $(seq 1 "$rounds"); do
  for isa in $isas; do
    for p in fp32 bf16; do
      read -r oi om < <(run "$old" "$isa" "$p")
      read -r ni nm < <(run "$new" "$isa" "$p")
      echo "| $r | $isa | $p | $oi | $ni | $(python3 -c "print(f'{$ni/$oi:.2f}x')") | $om | $nm |"
    done
  done
done
