#!/usr/bin/env bash
# Runs every CPU measurement that docs/PERFORMANCE.md reports, one after the other, and
# writes each table to OUT (default bench-out/). Needs build/ (./scripts/build.sh) and the
# test dependencies (./scripts/install-deps.sh --test). Takes about 25 minutes on 2 cores;
# run it on an otherwise idle machine.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-bench-out}
mkdir -p "$out"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
T=$(nproc)
mpi="mpirun --oversubscribe --bind-to none"

echo "== spotrain vs PyTorch, fp32" >&2
/usr/bin/python3 bench/compare_pytorch.py --threads "$T" --steps 5 --warmup 2 --markdown \
  --json-out "$out/compare_fp32.json" > "$out/compare_fp32.md"
echo "== spotrain vs PyTorch, bf16 (PyTorch: autocast)" >&2
/usr/bin/python3 bench/compare_pytorch.py --threads "$T" --steps 5 --warmup 2 --markdown \
  --precision bf16 --cases resnet50 --json-out "$out/compare_bf16.json" > "$out/compare_bf16.md"
echo "== gradient checkpointing, ResNet-50 batch 64" >&2
bench/checkpointing.sh 64 3 fp32 > "$out/checkpointing.md"
echo "== MPI all-reduce bandwidth, 2 ranks" >&2
$mpi -np 2 build/bench/bench_allreduce > "$out/allreduce.md"
echo "== overlap: 1 rank vs 2 ranks, one thread each" >&2
for model in resnet50 fmnist; do
  if [[ $model == resnet50 ]]; then args="--model resnet50 --batch-size 32 --steps 3 --warmup 1"
  else args="--model resnet20 --image-size 28 --channels 1 --num-classes 10 --batch-size 128 --steps 20 --warmup 3"; fi
  OMP_NUM_THREADS=1 build/spotrain bench $args --threads 1 --json "$out/overlap_${model}_1.json" >&2
  $mpi -np 2 -x OMP_NUM_THREADS=1 build/spotrain bench $args --threads 1 \
    --json "$out/overlap_${model}_2.json" >&2
done
/usr/bin/python3 - "$out" > "$out/overlap.md" <<'PY'
import json, sys
out = sys.argv[1]
print("| model | ranks | images/s (all ranks) | forward s | backward s | exposed comm s | optimizer s | exposed comm / step |")
print("|---|---:|---:|---:|---:|---:|---:|---:|")
for m in ["resnet50", "fmnist"]:
    for r in [1, 2]:
        j = json.load(open(f"{out}/overlap_{m}_{r}.json")); p = j["phases"]
        step = p["data"] + p["forward"] + p["backward"] + p["comm_exposed"] + p["optimizer"]
        print(f"| {m} | {r} | {j['images_per_sec']:.2f} | {p['forward']:.3f} | {p['backward']:.3f} | "
              f"{p['comm_exposed']:.4f} | {p['optimizer']:.4f} | {100 * p['comm_exposed'] / step:.1f}% |")
PY
cat "$out"/*.md
