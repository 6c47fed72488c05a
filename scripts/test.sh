#!/usr/bin/env bash
# Installs the dependencies (with the Python packages used by side-by-side checks), builds
# with the CUDA backend compiled when nvcc is present, and runs the whole CTest suite.
# GPU tests skip cleanly on machines without a GPU. SPOTRAIN_WERROR=ON (CI's) makes a warning in
# our own code fail the build.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh --test
./scripts/build.sh -DSPOTRAIN_CUDA="${SPOTRAIN_CUDA:-AUTO}" -DSPOTRAIN_WERROR="${SPOTRAIN_WERROR:-OFF}"
cd build
ctest --output-on-failure --timeout 900 -j "$(nproc)"
