#!/usr/bin/env bash
# The main job on a fresh Debian 12 machine: installs the dependencies, builds, trains the
# default model (ResNet-20) on Fashion-MNIST on the GPU if there is one, else the CPU,
# evaluates on the 10,000 test images after every epoch, writes metrics to
# runs/demo/metrics.jsonl and the final checkpoint to runs/demo/, then evaluates that checkpoint. Extra arguments go to `spotrain train`.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
SPOTRAIN_TARGET=spotrain ./scripts/build.sh
mkdir -p runs/demo
./build/spotrain train --model resnet20 --data fashion-mnist --epochs 6 --batch-size 128 \
  --lr 0.1 --device auto --metrics runs/demo/metrics.jsonl --ckpt-dir runs/demo "$@"
# Evaluate the final checkpoint on all 10,000 test images.
./build/spotrain eval --ckpt runs/demo --data fashion-mnist
