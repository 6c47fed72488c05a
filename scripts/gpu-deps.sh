#!/usr/bin/env bash
# Downloads (never installs) the Debian 12 packages that a GPU node without network access
# (nvcc and perhaps PyTorch there, but no Debian packages) lacks to build and run spotrain:
# oneDNN, OpenMPI, HDF5, libjpeg-turbo, libpng, zlib, nlohmann-json, CLI11, GoogleTest and
# pkgconf (CMake finds libjpeg and libpng through pkg-config), with the shared libraries they
# load, and OpenMPI's mpirun. Run it on a Debian 12 machine with network; it fills .gpu-debs/
# (git-ignored), which scripts/gpu-check.sh unpacks into a private prefix on the GPU node.
#
#   ./scripts/gpu-deps.sh [DIR]      (default DIR: .gpu-debs in the repository root)
#
# Which runtime packages: the shared libraries we link (libdnnl.so.2, libmpi.so.40,
# libhdf5_serial.so.103, libturbojpeg.so.0, libjpeg.so.62, libpng16.so.16) and, recursively,
# every library they name as NEEDED (read with readelf from the downloaded packages), except
# the C/C++ runtime every CUDA image has (glibc, libstdc++, libgcc_s, libgomp, zlib). Plugins
# that OpenMPI or hwloc open at run time (verbs, UCX, libfabric...) are left out: one process
# per GPU needs none.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-.gpu-debs}"

# Headers, CMake files and static libraries the build needs.
dev_pkgs=(libdnnl-dev libopenmpi-dev libhdf5-dev libturbojpeg0-dev libjpeg62-turbo-dev
          libpng-dev zlib1g-dev nlohmann-json3-dev libcli11-dev libtoml11-dev libgtest-dev libgmock-dev
          pkgconf pkgconf-bin libpkgconf3)
# The shared libraries linked into spotrain, by package, and the file names to start from.
rt_pkgs=(libdnnl2 libopenmpi3 libhdf5-103-1 libturbojpeg0 libjpeg62-turbo libpng16-16)
rt_roots=(libdnnl.so.2 libmpi.so.40 libhdf5_serial.so.103 libturbojpeg.so.0 libjpeg.so.62
          libpng16.so.16)
# Sonames assumed present on any machine with nvcc and a host compiler.
base_sonames=" libc.so.6 libm.so.6 libpthread.so.0 libdl.so.2 librt.so.1 libutil.so.1
  libresolv.so.2 ld-linux-x86-64.so.2 libstdc++.so.6 libgcc_s.so.1 libgomp.so.1 libz.so.1 "

command -v apt-get >/dev/null && command -v readelf >/dev/null ||
  { echo "gpu-deps: needs apt-get and readelf (binutils) on a Debian 12 machine" >&2; exit 1; }
grep -q 'VERSION_ID="12"' /etc/os-release 2>/dev/null ||
  echo "gpu-deps: warning: this is not Debian 12; the packages must match Debian 12's" >&2

# As root, apt fetches as the _apt user, who cannot write here: fetch as root instead.
apt_opts=()
[[ $(id -u) -eq 0 ]] && apt_opts=(-o APT::Sandbox::User=root)

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/cand" "$work/root"

# Candidates for the runtime closure: the packages' own dependency closure (no recommends).
mapfile -t cand < <(apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts \
    --no-breaks --no-replaces --no-enhances "${rt_pkgs[@]}" 2>/dev/null |
  grep -v '^ ' | grep -v '^<' | grep -v ':i386$' | sort -u)
echo "gpu-deps: ${#cand[@]} candidate runtime packages; downloading to inspect them"
(cd "$work/cand" && apt-get download -q "${apt_opts[@]}" "${cand[@]}" >/dev/null)

# soname/file name -> package, and every file unpacked into one tree for readelf.
declare -A pkg_of
for deb in "$work"/cand/*.deb; do
  p=$(dpkg-deb -f "$deb" Package)
  dpkg -x "$deb" "$work/root"
  while read -r f; do pkg_of[$(basename "$f")]=$p; done < <(dpkg-deb -c "$deb" | awk '{print $6}' | grep -E '\.so(\.|$)')
done

# Breadth-first over NEEDED entries, starting from the libraries we link.
declare -A seen keep
queue=("${rt_roots[@]}")
for p in "${rt_pkgs[@]}"; do keep[$p]=1; done
while ((${#queue[@]})); do
  so=${queue[0]}
  queue=("${queue[@]:1}")
  [[ -n "${seen[$so]:-}" ]] && continue
  seen[$so]=1
  [[ "$base_sonames" == *" $so "* ]] && continue
  p=${pkg_of[$so]:-}
  if [[ -z "$p" ]]; then
    echo "gpu-deps: warning: no candidate package ships $so (assumed present on the GPU machine)" >&2
    continue
  fi
  keep[$p]=1
  f=$(find "$work/root" -name "$so" \( -type f -o -type l \) | head -1)
  while read -r n; do queue+=("$n"); done < <(readelf -d "$(readlink -f "$f")" 2>/dev/null |
    sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
done

rm -rf "$out"
mkdir -p "$out"
# mpirun for the two-ranks-on-one-GPU check (its libraries are libopenmpi3's, kept above).
tool_pkgs=(openmpi-bin openmpi-common)
pkgs=("${dev_pkgs[@]}" "${tool_pkgs[@]}" "${!keep[@]}")
echo "gpu-deps: downloading ${#pkgs[@]} packages into $out"
(cd "$out" && apt-get download -q "${apt_opts[@]}" "${pkgs[@]}" >/dev/null)
printf '%s\n' "${pkgs[@]}" | sort > "$out/PACKAGES"
du -sh "$out" | awk '{print "gpu-deps: " $1 " in " $2 " (carry it to the GPU machine with the repository)"}'
