#!/usr/bin/env bash
# Installs every Debian 12 package spotrain needs to build, train and test.
# Idempotent: re-running only installs what is missing. Pass --test to add the
# Python packages used by side-by-side checks (PyTorch, torchvision, h5py) and what the
# multi-host, report, image and Slurm tests run (iproute2, chromium; podman, runc,
# debootstrap; slurm-wlm, munge).
set -euo pipefail

pkgs=(build-essential cmake ninja-build pkg-config git
      libdnnl-dev libopenmpi-dev openmpi-bin libhdf5-dev hdf5-tools libcurl4-openssl-dev
      libturbojpeg0-dev libjpeg62-turbo-dev libpng-dev zlib1g-dev libgtest-dev libgmock-dev libbenchmark-dev
      libcli11-dev nlohmann-json3-dev libtoml11-dev libjs-chart.js dataset-fashion-mnist)
if [[ "${1:-}" == "--test" ]]; then
  # iproute2: the multi-host tests' network namespaces; chromium: the report test's browser;
  # podman, runc, debootstrap: test_image.sh's engine (runc where crun cannot run, e.g. on
  # cgroup v1/v2 hybrids) and its base image; slurm-wlm, munge: test_slurm's one-node Slurm
  pkgs+=(python3 python3-numpy python3-torch python3-torchvision python3-h5py iproute2 chromium
         podman runc debootstrap slurm-wlm munge)
fi

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
  echo "install-deps: all ${#pkgs[@]} packages present"
  exit 0
fi
SUDO=""
[[ $(id -u) -ne 0 ]] && SUDO=sudo
echo "install-deps: installing ${missing[*]}"
$SUDO apt-get update -q
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
