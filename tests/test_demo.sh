#!/usr/bin/env bash
# scripts/demo.sh end to end at a small size (its six epochs of 512 images, the binary under test):
# its run folder holds the evaluation and the report, and its last line says how long each
# part took (README quotes such a line, measured). Skipped (77) without Debian's Fashion-MNIST.
set -euo pipefail
bin=$1
[[ -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]] || { echo "no Fashion-MNIST: skipped"; exit 77; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
out=$(SPOTRAIN_DEMO_DIR="$dir/demo" SPOTRAIN_DEMO_BIN="$bin" "$(dirname "$0")/../scripts/demo.sh" \
        --train-limit 512 --test-limit 256 --threads 2 2>&1)
last=$(printf '%s\n' "$out" | tail -n 1)
fail() { printf '%s\n' "$out" | tail -n 20; echo "FAIL: $*"; exit 1; }
[[ "$last" =~ ^demo\.sh:\ finished\ in\ [0-9]+m[0-9]{2}s:\ installing\ and\ building\ [0-9]+m[0-9]{2}s,\ training\ [0-9]+m[0-9]{2}s,\ evaluating\ and\ the\ report\ [0-9]+m[0-9]{2}s$ ]] ||
  fail "the last line does not say how long the parts took: $last"
[[ -s "$dir/demo/report.html" ]] || fail "no report.html"
grep -q '"epochs_done": 6' "$dir/demo/eval-final.json" || fail "eval-final.json does not say 6 epochs done"
echo "ok: $last"
