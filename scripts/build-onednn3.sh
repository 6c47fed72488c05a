#!/usr/bin/env bash
# Builds spotrain's CLI against oneDNN 3.x from PyPI (onednn-devel, with the SYCL and OpenCL
# runtimes it needs, about 2 GB) into build-onednn3/, beside the default build on Debian's
# oneDNN 2.6, so that bench/compare_onednn.sh can run both. Debian's 2.6 stays the default: on
# the machines measured it was the faster (docs/PERFORMANCE.md, "oneDNN 2.6 or 3.x").
# ONEDNN_PREFIX (default /opt/spotrain-onednn3) is where the packages go; ONEDNN_VERSION pins one.
set -euo pipefail
cd "$(dirname "$0")/.."
prefix=${ONEDNN_PREFIX:-/opt/spotrain-onednn3}
pkg="onednn-devel${ONEDNN_VERSION:+==$ONEDNN_VERSION}"
if ! command -v pip3 >/dev/null 2>&1 && ! python3 -m pip --version >/dev/null 2>&1; then
  apt-get update && apt-get install -y python3-pip
fi
pip=(python3 -m pip)
if [[ ! -f $prefix/include/oneapi/dnnl/dnnl.hpp ]]; then
  echo "installing $pkg into $prefix (about 2 GB)" >&2
  "${pip[@]}" install --quiet --prefix "$prefix" --ignore-installed --no-warn-script-location \
    --break-system-packages "$pkg" 2>/dev/null ||
    "${pip[@]}" install --quiet --prefix "$prefix" --ignore-installed --no-warn-script-location "$pkg"
fi
[[ -f $prefix/lib/libdnnl.so ]] || { echo "build-onednn3.sh: error: no libdnnl.so under $prefix/lib after installing $pkg" >&2; exit 1; }
cmake -S . -B build-onednn3 -G Ninja -DCMAKE_BUILD_TYPE=Release -DSPOTRAIN_CUDA=OFF \
  -DSPOTRAIN_BUILD_TESTS=OFF -DSPOTRAIN_BUILD_BENCH=OFF -DSPOTRAIN_DNNL_ROOT="$prefix" "$@"
cmake --build build-onednn3 --parallel "$(nproc)" --target spotrain
build-onednn3/spotrain --version | head -1
