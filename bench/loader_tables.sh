#!/usr/bin/env bash
# The input-pipeline tables of docs/PERFORMANCE.md: spotrain's loader against torchvision's
# (training and evaluation transforms, per core and with 2 threads/workers), and from packed
# shards against the folder. Needs build/ (bench_loader, spotrain) and /usr/bin/python3 with
# torch, torchvision and PIL. DATA (default /tmp/spotrain-jpegs) is made once, about 1 minute.
set -euo pipefail
cd "$(dirname "$0")/.."
data=${DATA:-/tmp/spotrain-jpegs}
out=${OUT:-bench-out}
mkdir -p "$out"
[[ -d $data/train ]] || /usr/bin/python3 bench/make_jpeg_folder.py "$data" --train 1000 --val 100
echo "== loader, training transforms" >&2
/usr/bin/python3 bench/compare_loader.py "$data" --workers 1,2 --batch 32 --batches 20 --repeats 5 \
  --markdown | tee "$out/loader_train.md"
echo "== loader, evaluation transforms" >&2
/usr/bin/python3 bench/compare_loader.py "$data" --workers 1 --batch 32 --batches 20 --repeats 5 \
  --eval --markdown | tee "$out/loader_eval.md"
echo "== loader, folder vs packed shards (1 thread)" >&2
[[ -f $data-shards/train/index.bin ]] || build/spotrain data pack "$data" "$data-shards" --shard-size 64MiB >&2
for i in 1 2 3; do
  build/bench/bench_loader --data "imagefolder:$data" --workers 1 --batch 32 --batches 20
  build/bench/bench_loader --data "shards:$data-shards" --workers 1 --batch 32 --batches 20
done | tee "$out/loader_shards.jsonl"
