#!/usr/bin/env bash
# The main job on a fresh Debian 12 machine: installs the dependencies, builds, trains the
# default model (ResNet-20) on Fashion-MNIST on the GPU if there is one, else the CPU,
# evaluates on the 10,000 test images after every epoch, writes its run folder runs/demo/
# (settings, metrics.jsonl, train.log, checkpoints; a previous demo run moves to
# runs/demo/previous-<time>/), then evaluates the final checkpoint and writes the run's report
# (runs/demo/report.html, opens offline). Extra arguments go to `spotrain train`.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
SPOTRAIN_TARGET=spotrain ./scripts/build.sh
mkdir -p runs/demo
./build/spotrain train --model resnet20 --data fashion-mnist --epochs 6 --batch-size 128 \
  --lr 0.1 --device auto --ckpt-dir runs/demo --new-run "$@"
# Evaluate the final checkpoint on all 10,000 test images; the page shows the result too.
./build/spotrain eval --ckpt runs/demo --data fashion-mnist --json runs/demo/eval-final.json
./build/spotrain report runs/demo
