#!/usr/bin/env bash
# Configures and builds spotrain (Release, Ninja) into build/ with every core there is.
# Extra arguments go to cmake, e.g. ./scripts/build.sh -DSPOTRAIN_CUDA=OFF; set
# SPOTRAIN_TARGET to build one target only (the demo builds just the CLI).
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "$@"
cmake --build build --parallel "$(nproc)" ${SPOTRAIN_TARGET:+--target "$SPOTRAIN_TARGET"}
