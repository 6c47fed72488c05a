#!/usr/bin/env bash
# Two spotrain binaries side by side, alternating, on the cases a refactor must not slow:
# ResNet-50 batch 32 fp32 and bf16 (224x224, synthetic) and the Fashion-MNIST demo step
# (resnet20, 28x28x1, batch 128). Prints a markdown table of median images/s per case and the
# ratio B/A, each binary's median over ROUNDS alternating rounds.
#   bench/compare_builds.sh OLD_BINARY NEW_BINARY [ROUNDS]
set -euo pipefail
a=$1 b=$2 rounds=${3:-2}
T=$(nproc)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cases=(
  "resnet50-fp32|--model resnet50 --batch-size 32 --precision fp32 --steps 6 --warmup 2"
  "resnet50-bf16|--model resnet50 --batch-size 32 --precision bf16 --steps 6 --warmup 2"
  "fmnist-demo|--model resnet20 --image-size 28 --channels 1 --num-classes 10 --batch-size 128 --steps 30 --warmup 5"
)
for r in $(seq 1 "$rounds"); do
  for c in "${cases[@]}"; do
    name=${c%%|*} args=${c#*|}
    for side in A B; do
      bin=$a; [[ $side == B ]] && bin=$b
      echo "round $r: $name ($side)" >&2
      # shellcheck disable=SC2086
      "$bin" bench $args --threads "$T" --device cpu --json "$tmp/$name.$side.$r.json" > /dev/null
    done
  done
done
/usr/bin/python3 - "$tmp" "$rounds" "$a" "$b" <<'PY'
import json, statistics, sys
tmp, rounds, a, b = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
print(f"A = {a}, B = {b}; {rounds} alternating rounds, median images/s per round")
print("| case | A images/s | B images/s | B / A |")
print("|---|---:|---:|---:|")
for name in ["resnet50-fp32", "resnet50-bf16", "fmnist-demo"]:
    v = {s: [json.load(open(f"{tmp}/{name}.{s}.{r}.json"))["images_per_sec"] for r in range(1, rounds + 1)]
         for s in "AB"}
    ma, mb = statistics.median(v["A"]), statistics.median(v["B"])
    fmt = lambda xs: " / ".join(f"{x:.1f}" for x in xs)
    print(f"| {name} | {ma:.1f} ({fmt(v['A'])}) | {mb:.1f} ({fmt(v['B'])}) | {mb / ma:.3f} |")
PY
