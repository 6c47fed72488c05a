#!/usr/bin/env bash
# The main job on a fresh Debian 12 machine: installs the dependencies, builds, trains the
# default model (ResNet-20) on Fashion-MNIST on the GPU if there is one, else the CPU,
# evaluates on the 10,000 test images after every epoch, writes its run folder runs/demo/
# (settings, metrics.jsonl, train.log, checkpoints; a previous demo run moves to
# runs/demo/previous-<time>/), then evaluates the final checkpoint and writes the run's report
# (runs/demo/report.html, opens offline). Extra arguments go to `spotrain train`. Its last
# line says how long each part took on this machine. SPOTRAIN_DEMO_DIR: another run folder;
# SPOTRAIN_DEMO_BIN: a spotrain built already (nothing is installed or built then; the tests).
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${SPOTRAIN_DEMO_DIR:-runs/demo}
bin=${SPOTRAIN_DEMO_BIN:-./build/spotrain}
t0=$SECONDS
if [[ -z "${SPOTRAIN_DEMO_BIN:-}" ]]; then
  ./scripts/install-deps.sh
  SPOTRAIN_TARGET=spotrain ./scripts/build.sh
fi
t1=$SECONDS
mkdir -p "$dir"
"$bin" train --model resnet20 --data fashion-mnist --epochs 6 --batch-size 128 \
  --lr 0.1 --device auto --ckpt-dir "$dir" --new-run "$@"
t2=$SECONDS
# Evaluate the final checkpoint on all 10,000 test images; the page shows the result too.
"$bin" eval --ckpt "$dir" --data fashion-mnist --json "$dir/eval-final.json"
"$bin" report "$dir"
t3=$SECONDS
hms() { printf '%dm%02ds' $(($1 / 60)) $(($1 % 60)); }
echo "demo.sh: finished in $(hms $((t3 - t0))): installing and building $(hms $((t1 - t0))), training $(hms $((t2 - t1))), evaluating and the report $(hms $((t3 - t2)))"
