#!/usr/bin/env bash
# The GPU check: on a machine with one NVIDIA GPU, builds spotrain with the CUDA backend (or
# takes binaries built beforehand from GPU_PREBUILT), runs the `gpu` tests in parallel shards,
# then ResNet-50 training throughput (224x224, batch 256, synthetic) with `spotrain bench` at
# fp16 (eager and CUDA Graph) / bf16 / tf32 and fp16 with gradient checkpointing, and PyTorch
# (bench/torch_gpu_resnet50.py) in the same run, a resume and a two-rank check; prints a
# short table last. Everything ends
# within GPU_BUDGET_S (470) seconds.
#
# Made for a GPU node without network access: nvcc, PyTorch, cmake and ninja present; cuDNN,
# cuBLAS and NCCL possibly only inside Python's site-packages/nvidia/* wheels; no Debian
# packages. The Debian packages come from .gpu-debs/ (scripts/gpu-deps.sh, run beforehand on
# Debian 12) and are unpacked with dpkg -x into a private prefix; nothing is installed. The
# binaries find that prefix through their RPATH, so no library path is exported to other
# programs (cmake, nvcc, Python). Without a GPU every step up to the GPU ones still runs, and
# those report "no CUDA device".
#
# Results: $OUT/summary.txt (the table), results.json (all figures and versions) and
# logs.tar.gz (logs/: machine, configure, build, version, gpu-tests, bench-*, torch ...).
#
# Environment: OUT (gpu-out), GPU_DEBS (.gpu-debs), GPU_PREFIX (/tmp/spotrain-gpu-prefix),
# GPU_BUILD (build-gpu), GPU_PREBUILT (.gpu-bin: spotrain and test_gpu* built beforehand by a
# dry run with GPU_PACK_PREBUILT=1; used when present and they start), GPU_BUDGET_S (470),
# GPU_JOBS (all cores), GPU_PYTHON (the python3 with PyTorch), GPU_BENCH_STEPS (20),
# GPU_BENCH_WARMUP (5), GPU_STEPS (which steps, default "doctor tests bench torch graph compile profile
# fusion tuning resume ranks2 more", run in that order of importance so that a short budget cuts only
# the last: `spotrain doctor --device cuda` (the node check); the gpu tests; fp16 ours (also end to end) and PyTorch's; fp16 in the default
# configuration (captured steps, --fusion auto) and fp16 --cuda-graph (captured or not; every
# other bench row runs eager and unfused, --no-cuda-graph --fusion none, unless it names them); "compile": PyTorch's best, torch.compile mode="reduce-overhead" at fp16 and
# bf16; fp16 --profile with the kernels chosen per shape; "fusion": fp16 with
# --fusion bn, timed and profiled (which graphs cuDNN took and ran); "tuning": fp16 and
# --fusion bn with cuDNN's heuristics' first choices (--no-autotune) against the timed ones,
# and a short ResNet-50 training run's wall time with an empty kernel cache, then with the
# cache it left; "resume": a --cuda-graph run
# stopped with a checkpoint and resumed, against one straight through; "ranks2": two ranks
# on the one GPU (host-staged gradients), agreed stop and resume; "more": bf16, tf32, fp16
# with stage and selective checkpointing. Not by default: "train" (Fashion-MNIST convergence and determinism,
# data from GPU_FMNIST), "levers" (fp16 without the
# fused BN + Add + ReLU, bf16 --cuda-graph), "loader" (JPEG loader, GPU_JPEGS x 4 images)),
# GPU_KEEP_LOGS=1 (keep $OUT/logs/ unpacked too), GPU_SIMULATE_BARE=1 (dry run, as root, on a
# Debian machine that has the packages installed: the script runs in a mount namespace of its
# own in which every file the bundle's packages install under /usr is hidden, except the
# shared libraries the build tools themselves load, so that the build and our programs find
# what the bundle brings only in the prefix, as on the GPU machine; CMake is also kept from
# finding anything under /usr), GPU_PACK_PREBUILT=1 (after the build, copy the stripped
# binaries into GPU_PREBUILT).
#
# Before the GPU steps, "libs" checks that each of our programs loads every library the bundle
# brings from the prefix (a library found elsewhere fails it, with its path), and the gpu
# tests are counted by name from their shards' reports: passed, failed, skipped, crashed (with
# the signal) and never run (after a crash in their shard), each failure listed in the summary.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
repo=$PWD
# The bare dry run: this script again, in a mount namespace of its own (hide_system_copies).
if [[ -n "${GPU_SIMULATE_BARE:-}" && -z "${SPOTRAIN_BARE_NS:-}" ]]; then
  command -v unshare >/dev/null && [[ $(id -u) -eq 0 ]] ||
    { echo "gpu-check: GPU_SIMULATE_BARE=1 needs root and unshare (util-linux) for its mount namespace" >&2; exit 1; }
  exec unshare --mount --propagation private env SPOTRAIN_BARE_NS=1 bash "$0" "$@"
fi
out=${OUT:-gpu-out}
mkdir -p "$out" && out=$(cd "$out" && pwd)
# Every log and JSON file goes to $out/logs; at the end they are packed into logs.tar.gz next
# to summary.txt and results.json (three files to copy off the GPU node).
logs=$out/logs
rm -rf "$logs" "$out/logs.tar.gz" && mkdir -p "$logs"
debs=${GPU_DEBS:-$repo/.gpu-debs}
prefix=${GPU_PREFIX:-/tmp/spotrain-gpu-prefix}
build=${GPU_BUILD:-$repo/build-gpu}
budget=${GPU_BUDGET_S:-470}
jobs=${GPU_JOBS:-$(nproc)}
steps=${GPU_BENCH_STEPS:-20}
warmup=${GPU_BENCH_WARMUP:-5}
arch=x86_64-linux-gnu
start=$SECONDS
summary="$logs/steps.tsv"
: > "$summary"
# The Python that has PyTorch (its nvidia-* wheels hold cuDNN, cuBLAS and NCCL there).
python=""
for c in ${GPU_PYTHON:-} python3 /usr/bin/python3; do
  if command -v "$c" >/dev/null && "$c" -c 'import torch' 2>/dev/null; then python=$(command -v "$c"); break; fi
done
[[ -z "$python" ]] && python=$(command -v python3 || true)

# Step limits are sized for the 16-core GPU machine and a 470 s budget; a larger budget (a
# dry run on a small machine) stretches them in proportion.
scale=100
((budget > 470)) && scale=$((budget * 100 / 470))
left() { echo $((budget - (SECONDS - start))); }
note() { echo "gpu-check: $*" | tee -a "$logs/gpu-check.log"; }
record() { printf '%s\t%s\t%s\n' "$1" "$2" "$3" >> "$summary"; }
# restatus TEXT: replaces the status of the last step recorded; laststatus prints it.
laststatus() { tail -n 1 "$summary" | cut -f2; }
restatus() {
  awk -v s="$1" -v n="$(wc -l < "$summary")" 'BEGIN { FS = OFS = "\t" } NR == n { $2 = s } { print }' \
    "$summary" > "$summary.tmp" && mv "$summary.tmp" "$summary"
}

# run_step NAME MAX_SECONDS COMMAND...: runs COMMAND (stdout and stderr to $logs/NAME.log)
# under a timeout of MAX_SECONDS or what is left of the budget, whichever is less.
run_step() {
  local name=$1 max=$(($2 * scale / 100))
  shift 2
  local t=$(($(left) - 10))
  ((t > max)) && t=$max
  if ((t < 5)); then
    note "$name: skipped, out of time"
    record "$name" "skipped: out of time" 0
    return 124
  fi
  note "$name (limit ${t} s)"
  local t0=$SECONDS rc=0
  timeout --kill-after=5 "$t" "$@" > "$logs/$name.log" 2>&1 || rc=$?
  local st=ok
  if ((rc == 124 || rc == 137)); then st="TIMEOUT after $t s"
  elif ((rc > 128)); then st="CRASHED (signal $((rc - 128)), SIG$(kill -l $((rc - 128)) 2>/dev/null))"
  elif ((rc != 0)); then st="FAILED (exit $rc)"; fi
  record "$name" "$st" $((SECONDS - t0))
  tail -n 4 "$logs/$name.log" | sed 's/^/    /'
  return $rc
}

# nvcc: on PATH, in /usr/local/cuda, or from Python's nvidia-cuda-nvcc wheel.
nvcc=$(command -v nvcc || true)
[[ -z "$nvcc" && -x /usr/local/cuda/bin/nvcc ]] && nvcc=/usr/local/cuda/bin/nvcc
if [[ -z "$nvcc" && -n "$python" ]]; then
  nvcc=$("$python" -c 'import glob, os, nvidia; print(next(iter(sorted(glob.glob(os.path.join(nvidia.__path__[0], "*", "bin", "nvcc")))), ""))' 2>/dev/null)
fi
if [[ -n "$nvcc" ]]; then PATH="$(dirname "$nvcc"):$PATH"; export PATH; fi

# ---- the machine ----------------------------------------------------------------------
{
  echo "date: $(date -u +%FT%TZ)"; echo "host: $(uname -srm), $(nproc) cores"
  grep -m1 PRETTY_NAME /etc/os-release 2>/dev/null
  command -v nvidia-smi >/dev/null && timeout 20 nvidia-smi 2>&1
  [[ -n "$nvcc" ]] && echo "nvcc: $nvcc" && "$nvcc" --version | tail -2 || echo "no nvcc found"
  cmake --version | head -1; ninja --version 2>/dev/null | sed 's/^/ninja /'
  c++ --version 2>/dev/null | head -1
  ldd --version 2>/dev/null | head -1
  [[ -n "$python" ]] && "$python" -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())' 2>&1
} > "$logs/machine.log" 2>&1
gpu=""
if command -v nvidia-smi >/dev/null && timeout 20 nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
  gpu=$(timeout 20 nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | head -1)
  note "GPU: $gpu"
else
  note "no CUDA device (nvidia-smi finds no GPU): the GPU steps will report that"
fi

# The .debs are Debian 12's, built against glibc 2.36.
glibc=$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{print $2}')
if [[ -n "$glibc" ]] && [[ "$(printf '%s\n' 2.36 "$glibc" | sort -V | head -1)" != 2.36 ]]; then
  note "warning: glibc $glibc is older than Debian 12's 2.36; the unpacked libraries may not load"
fi

# ---- Debian packages into a private prefix ---------------------------------------------
# unpack_deb DEB DIR: dpkg -x, or where there is no dpkg, Python reading the ar archive.
unpack_deb() {
  if command -v dpkg >/dev/null; then dpkg -x "$1" "$2"; return; fi
  "${python:-python3}" - "$1" "$2" <<'PYDEB'
import io, sys, tarfile
data = open(sys.argv[1], "rb").read()
assert data[:8] == b"!<arch>\n", "not a .deb"
pos = 8
while pos < len(data):
    name = data[pos:pos + 16].decode().strip().rstrip("/")
    size = int(data[pos + 48:pos + 58].decode().strip())
    body = data[pos + 60:pos + 60 + size]
    if name.startswith("data.tar"):
        kw = {"filter": "tar"} if hasattr(tarfile, "tar_filter") else {}  # keep absolute links
        tarfile.open(fileobj=io.BytesIO(body)).extractall(sys.argv[2], **kw)
    pos += 60 + size + (size & 1)
PYDEB
}
have_system_pkgs() { dpkg-query -W -f='${Status}' libdnnl-dev 2>/dev/null | grep -q "ok installed"; }
# hide_system_copies (the bare dry run, inside its mount namespace): /usr/bin, /usr/include,
# /usr/lib/x86_64-linux-gnu and /usr/share get an overlay whose upper layer is private to
# this run, and every file that a package of the bundle installs there is deleted from it
# (the machine's own files stay as they are outside the namespace). Kept: the shared
# libraries the build tools load (cmake, the compilers, the linker, nvcc, Python, PyTorch), which a
# GPU machine also has in some form; the "libs" step checks that our programs still load
# the bundle's copies of those from the prefix.
hide_system_copies() {
  local ovl=/tmp/spotrain-bare-overlay d n=0 kept=0 f real tool
  rm -rf "$ovl"
  declare -A keep
  local tools=(cmake ninja c++ cc g++ gcc ld ld.bfd as strip readelf nm ar ranlib python3 tar
               gzip dpkg dpkg-deb git bash env sha256sum find sort awk sed grep xargs timeout
               "$(c++ -print-prog-name=cc1plus 2>/dev/null)" "$(c++ -print-prog-name=collect2 2>/dev/null)"
               "$(c++ -print-prog-name=lto-wrapper 2>/dev/null)" "$(cc -print-prog-name=cc1 2>/dev/null)")
  local cuda_bin
  cuda_bin=$(dirname "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)")
  for tool in "${tools[@]}" "$cuda_bin"/* "$cuda_bin"/../nvvm/bin/*; do
    tool=$(command -v "$tool" 2>/dev/null || echo "$tool")
    [[ -f "$tool" && -x "$tool" ]] || continue
    while read -r f; do
      [[ -n "$f" ]] && keep[$(readlink -f "$f")]=1
    done < <(ldd "$tool" 2>/dev/null | awk '/=> \//{print $3}')
  done
  # The PyTorch we compare with is the machine's own (wheels with their libraries on the GPU
  # node): the libraries its extension modules load stay too (Debian's loads oneDNN).
  if [[ -n "$python" ]]; then
    for tool in $("$python" -c 'import glob, os, torch; d = os.path.dirname(torch.__file__); print(" ".join(glob.glob(d + "/_C*.so") + glob.glob(d + "/lib/*.so*")))' 2>/dev/null); do
      while read -r f; do
        [[ -n "$f" ]] && keep[$(readlink -f "$f")]=1
      done < <(ldd "$tool" 2>/dev/null | awk '/=> \//{print $3}')
    done
  fi
  for d in bin include lib/x86_64-linux-gnu share; do
    mkdir -p "$ovl/$d/up" "$ovl/$d/work"
    mount -t overlay overlay -o "lowerdir=/usr/$d,upperdir=$ovl/$d/up,workdir=$ovl/$d/work" "/usr/$d" ||
      { note "cannot overlay /usr/$d: the dry run cannot hide the machine's packages"; exit 1; }
  done
  while read -r f; do
    f=/${f#./}
    [[ "$f" == /usr/bin/* || "$f" == /usr/include/* || "$f" == /usr/lib/x86_64-linux-gnu/* ||
       "$f" == /usr/share/* ]] || continue
    [[ -e "$f" || -L "$f" ]] && [[ ! -d "$f" || -L "$f" ]] || continue
    real=$(readlink -f "$f")
    if [[ -n "${keep[$real]:-}" ]]; then
      kept=$((kept + 1))
      echo "kept (a build tool loads it): $f" >> "$logs/bare.log"
      continue
    fi
    rm -f "$f" && n=$((n + 1))
  done < <(for deb in "$debs"/*.deb; do dpkg-deb -c "$deb" | awk '{print $6}'; done | sort -u)
  note "bare dry run: $n files of the bundle's packages hidden from /usr in this run's mount namespace ($kept shared libraries kept: the build tools load them; bare.log)"
}
if compgen -G "$debs/*.deb" >/dev/null; then
  t0=$SECONDS
  rm -rf "$prefix" && mkdir -p "$prefix"
  for d in "$debs"/*.deb; do unpack_deb "$d" "$prefix" || { note "cannot unpack $d"; exit 1; }; done
  # Absolute symlinks point at the host's /usr: re-point them inside the prefix.
  while IFS= read -r l; do
    tgt=$(readlink "$l")
    [[ "$tgt" == /* ]] && ln -sfn "$prefix$tgt" "$l"
  done < <(find "$prefix" -type l)
  record deps "ok ($(ls "$debs"/*.deb | wc -l) packages into $prefix)" $((SECONDS - t0))
  note "unpacked $(ls "$debs"/*.deb | wc -l) packages from $debs into $prefix"
  use_prefix=1
  [[ -n "${SPOTRAIN_BARE_NS:-}" ]] && hide_system_copies
elif have_system_pkgs && [[ -z "${GPU_SIMULATE_BARE:-}" ]]; then
  note "no $debs: using this machine's installed Debian packages"
  record deps "system packages" 0
  use_prefix=0
else
  note "no .deb files in $debs: run scripts/gpu-deps.sh on a Debian 12 machine first and bring .gpu-debs along"
  record deps "FAILED: no $debs" 0
  use_prefix=0
fi

# ---- the CUDA libraries of Python's nvidia-* wheels --------------------------------------
wheel_libs=""
if [[ -n "$python" ]]; then
  wheel_libs=$("$python" - <<'EOF' 2>/dev/null
import glob, os
try:
    import nvidia
except Exception:
    raise SystemExit(0)
dirs = []
for base in nvidia.__path__:
    dirs += sorted(glob.glob(os.path.join(base, "*", "lib")) + glob.glob(os.path.join(base, "*", "*", "lib")))
print(":".join(d for d in dirs if os.path.isdir(d)))
EOF
)
fi
[[ -n "$wheel_libs" ]] && note "CUDA libraries from Python wheels: ${wheel_libs//:/ }"

P=$prefix/usr
# Our programs (spotrain, the tests) find the CUDA libraries of the wheels, and the prefix's
# libraries, through this. The binaries' RPATH alone does not serve: the loader reads an
# RPATH only for libraries whose needing object has no RUNPATH of its own, and libmpi.so has
# one (/usr/lib/x86_64-linux-gnu/openmpi/lib), so libmpi's libopen-rte, libopen-pal and
# libhwloc came from wherever the machine had them (on a machine without them: nowhere).
# Nothing is exported: cmake, nvcc and Python keep the machine's own libraries.
prefix_ld=""
compgen -G "$debs/*.deb" >/dev/null &&
  prefix_ld="$P/lib/$arch:$P/lib/$arch/openmpi/lib:$P/lib/$arch/hdf5/serial"
ld_path="${prefix_ld}${prefix_ld:+${wheel_libs:+:}}${wheel_libs}"
ours=(env "LD_LIBRARY_PATH=${ld_path}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "XDG_CACHE_HOME=$out/xdg-cache")
# CMAKE_POLICY_VERSION_MINIMUM: a pip-installed CMake 4 still reads Debian's older
# package configuration files.
# PRE_TEST: the build does not run the test binaries to list their tests (ctest would; this
# script runs them itself, with the library path they need).
cmake_args=(-DCMAKE_BUILD_TYPE=Release -DSPOTRAIN_CUDA=ON -DSPOTRAIN_BUILD_BENCH=OFF
            -DSPOTRAIN_BUILD_TESTS=ON -DCMAKE_POLICY_VERSION_MINIMUM=3.5
            -DCMAKE_GTEST_DISCOVER_TESTS_DISCOVERY_MODE=PRE_TEST
            -DSPOTRAIN_CUDA_ARCHITECTURES="${GPU_ARCHS:-90}")
[[ -n "$python" ]] && cmake_args+=(-DSPOTRAIN_CUDA_PYTHON="$python")
[[ -n "$nvcc" ]] && cmake_args+=(-DCMAKE_CUDA_COMPILER="$nvcc")
if ((use_prefix)); then
  libdirs="$P/lib/$arch;$P/lib/$arch/openmpi/lib;$P/lib/$arch/hdf5/serial"
  zlib=$P/lib/$arch/libz.so
  if [[ ! -e "$zlib" ]]; then  # the -dev symlink points at the runtime zlib1g, not unpacked
    zlib=$(ldconfig -p 2>/dev/null | awk '/libz\.so\.1 .*x86-64/{print $NF; exit}')
    [[ -z "$zlib" ]] && zlib=$(ls /lib/$arch/libz.so.1 /usr/lib/$arch/libz.so.1 2>/dev/null | head -1)
  fi
  # pkg-config (libturbojpeg, libjpeg, libpng) through the unpacked pkgconf, reading only the
  # prefix's .pc files, with their /usr paths moved under the prefix (the sysroot).
  cat > "$prefix/pkg-config" <<PKG
#!/bin/sh
export LD_LIBRARY_PATH="$P/lib/$arch\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
export PKG_CONFIG_LIBDIR="$P/lib/$arch/pkgconfig:$P/share/pkgconfig" PKG_CONFIG_PATH=
export PKG_CONFIG_SYSROOT_DIR="$prefix"
exec "$P/bin/pkgconf" "\$@"
PKG
  chmod +x "$prefix/pkg-config"
  # -rpath-link: the linker finds the prefix's libraries that a linked library needs in turn
  # (libmpi.so -> libopen-rte, libopen-pal, libhwloc), in every link (FindMPI's test program
  # too), where it found only the machine's copies. --disable-new-dtags: an RPATH, which at
  # run time also serves the dependencies of libraries without a RUNPATH of their own.
  cmake_args+=(-DCMAKE_PREFIX_PATH="$P" -DPKG_CONFIG_EXECUTABLE="$prefix/pkg-config"
    -DCMAKE_BUILD_RPATH="$libdirs"
    -DCMAKE_EXE_LINKER_FLAGS="-Wl,--disable-new-dtags -Wl,-rpath-link,${libdirs//;/:}"
    -DDNNL_INCLUDE_DIR="$P/include" -DDNNL_LIBRARY="$P/lib/$arch/libdnnl.so"
    -DMPI_SKIP_COMPILER_WRAPPER=ON -DMPI_C_HEADER_DIR="$P/lib/$arch/openmpi/include"
    -DMPI_C_LIB_NAMES=mpi -DMPI_mpi_LIBRARY="$P/lib/$arch/openmpi/lib/libmpi.so"
    -DMPIEXEC_EXECUTABLE=/bin/false
    -DHDF5_ROOT="$P/lib/$arch/hdf5/serial" -DHDF5_NO_FIND_PACKAGE_CONFIG_FILE=ON
    -DHDF5_C_COMPILER_EXECUTABLE=/bin/false
    -DZLIB_INCLUDE_DIR="$P/include" -DZLIB_LIBRARY="$zlib"
    -DGTest_DIR="$P/lib/$arch/cmake/GTest" -Dnlohmann_json_DIR="$P/share/cmake/nlohmann_json"
    -DCLI11_DIR="$P/share/cmake/CLI11" -Dtoml11_DIR="$P/share/cmake/toml11"
    -DCMAKE_CXX_FLAGS="-isystem $P/include -isystem $P/include/$arch -isystem $P/include/hdf5/serial"
    -DCMAKE_CUDA_FLAGS="-isystem $P/include -isystem $P/include/$arch")
  if [[ -n "${GPU_SIMULATE_BARE:-}" ]]; then  # dry run: nothing from /usr may be found
    cmake_args+=(-DCMAKE_SYSTEM_IGNORE_PREFIX_PATH=/usr
      "-DCMAKE_IGNORE_PATH=/usr/include;/usr/include/$arch;/usr/lib/$arch;/usr/share/cmake;/usr/lib/$arch/cmake;/usr/lib/$arch/pkgconfig;/usr/share/pkgconfig")
  fi
fi
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)

# ---- binaries: built beforehand (GPU_PREBUILT) or configured and built here -------------------
prebuilt=${GPU_PREBUILT:-$repo/.gpu-bin}
# The sources the binaries are built from, hashed (with or without git): binaries built from
# other sources are not used.
sources_hash() {
  (cd "$repo" && find CMakeLists.txt cmake core kernels layers io comm checkpoints spot engine \
     observe run health tools tests -type f \( -name '*.cpp' -o -name '*.h' -o -name '*.cu' \
     -o -name '*.cmake' -o -name CMakeLists.txt -o -name '*.html' \) 2>/dev/null | LC_ALL=C sort |
   xargs sha256sum | sha256sum | cut -c1-16)
}
src_hash=$(sources_hash)
bin=""
if [[ -x "$prebuilt/spotrain" && "$(cat "$prebuilt/SOURCES" 2>/dev/null)" != "$src_hash" ]]; then
  note "the binaries in $prebuilt were built from other sources (hash $(cat "$prebuilt/SOURCES" 2>/dev/null || echo none), these: $src_hash): building"
elif [[ -x "$prebuilt/spotrain" ]] && "${ours[@]}" "$prebuilt/spotrain" --version > "$logs/prebuilt.log" 2>&1; then
  bin=$prebuilt
  note "using the binaries built beforehand in $prebuilt"
  record build "prebuilt ($prebuilt)" 0
elif [[ -x "$prebuilt/spotrain" ]]; then
  note "the binaries in $prebuilt do not start here ($(tail -n 1 "$logs/prebuilt.log")): building"
fi
if [[ -z "$bin" ]] &&
   run_step configure 120 cmake -S "$repo" -B "$build" "${generator[@]}" "${cmake_args[@]}"; then
  grep -E "spotrain: CUDA|Found (MPI_C|HDF5|GTest|ZLIB)" "$logs/configure.log" | sed 's/^/    /'
  targets=(spotrain)
  for t in $(cmake --build "$build" --target help 2>/dev/null | grep -oE '(^|[ :.])(test_gpu[A-Za-z0-9_]*|test_backend_ops)' |
             tr -d ' :.' | sort -u); do targets+=("$t"); done
  note "building ${targets[*]} with $jobs jobs"
  if run_step build 330 cmake --build "$build" --parallel "$jobs" --target "${targets[@]}"; then
    bin=$build
    if [[ -n "${GPU_PACK_PREBUILT:-}" ]]; then
      rm -rf "$prebuilt" && mkdir -p "$prebuilt"
      for t in "${targets[@]}"; do
        f=$build/$t
        [[ -x "$f" ]] || f=$build/tests/$t
        strip -o "$prebuilt/$t" "$f"
      done
      echo "$src_hash" > "$prebuilt/SOURCES"
      note "stripped ${targets[*]} into $prebuilt ($(du -sh "$prebuilt" | cut -f1); sources $src_hash)"
    fi
  fi
fi

# The gpu tests: every test_gpu* binary and the op suite's CUDA targets (test_backend_ops
# Cuda/*), each listed, then cut into GTest shards run side by side (one GPU holds them all;
# each shard pays context creation and cuDNN loading once), each shard's report and exit status
# kept for scripts/gpu_test_report.py. Run through `bash -c` under run_step's timeout, which
# ends the shards too.
gpu_tests() {
  local shards=${GPU_TEST_SHARDS:-6} pids=() outs=() t i n base filter k rc=0
  trap 'kill "${pids[@]}" 2>/dev/null; exit 124' TERM
  for t in "$bin"/test_gpu* "$bin"/tests/test_gpu* "$bin"/test_backend_ops "$bin"/tests/test_backend_ops; do
    [[ -x "$t" ]] || continue
    base=$(basename "$t")
    filter='*'
    [[ $base == test_backend_ops ]] && filter='Cuda/*'
    env LD_LIBRARY_PATH="$ours_ld" "$t" --gtest_list_tests --gtest_filter="$filter" \
      > "$logs/gpu-list-$base.txt" 2>&1
    n=$shards
    [[ $base == test_gpu_nccl ]] && n=1
    for ((i = 0; i < n; ++i)); do
      OMP_NUM_THREADS=2 GTEST_TOTAL_SHARDS=$n GTEST_SHARD_INDEX=$i env LD_LIBRARY_PATH="$ours_ld" "$t" \
        --gtest_color=no --gtest_filter="$filter" --gtest_output="json:$logs/gpu-test-$base-$i.json" \
        > "$logs/gpu-test-$base-$i.log" 2>&1 &
      pids+=($!)
      outs+=("$logs/gpu-test-$base-$i.rc")
    done
  done
  for k in "${!pids[@]}"; do
    wait "${pids[$k]}"
    echo $? > "${outs[$k]}"
  done
  cat "$logs"/gpu-test-*.log
  "${python:-python3}" "$repo/scripts/gpu_test_report.py" "$logs" --json "$logs/gpu-tests.json" \
    > "$logs/gpu-tests-report.txt" || rc=1
  cat "$logs/gpu-tests-report.txt"
  return $rc
}
# libs: each of our programs loads every library the bundle brings from the prefix, none from
# the machine (where a GPU machine may have another version, or none).
check_libs() {
  local t so arrow path f n=0 bad=()
  declare -A bundle
  while read -r f; do bundle[$(basename "$f")]=1; done < <(find "$P/lib" -name '*.so*' \( -type f -o -type l \))
  for t in "$bin"/spotrain "$bin"/test_gpu* "$bin"/tests/test_gpu* "$bin"/test_backend_ops \
           "$bin"/tests/test_backend_ops; do
    [[ -x "$t" ]] || continue
    while read -r so arrow path; do
      [[ "$arrow" == "=>" && -n "${bundle[$so]:-}" ]] || continue
      n=$((n + 1))
      if [[ "$path" != /* ]]; then bad+=("$so not found ($(basename "$t"))")
      elif [[ "$(readlink -f "$path")" != "$prefix"/* ]]; then bad+=("$so from $path ($(basename "$t"))"); fi
    done < <("${ours[@]}" LD_TRACE_LOADED_OBJECTS=1 "$t" 2>&1 | awk '{print $1, $2, $3}')
  done
  if ((${#bad[@]})); then
    printf '%s\n' "${bad[@]}"
    echo "FAILED: ${#bad[@]} of $n loads of the bundle's libraries not from the prefix: ${bad[0]}"
    return 1
  fi
  echo "ok: $n loads of the bundle's libraries, all from the prefix"
}
# mpirun for the ranks2 step: the prefix's (OpenMPI relocated there with OPAL_PREFIX), else
# the machine's.
mpirun=()
if ((use_prefix)) && [[ -x "$P/bin/mpirun.openmpi" ]]; then
  mpi_ld="$P/lib/$arch:$P/lib/$arch/openmpi/lib${wheel_libs:+:$wheel_libs}"
  mpirun=(env OPAL_PREFIX="$P" LD_LIBRARY_PATH="$mpi_ld" "$P/bin/mpirun.openmpi")
elif command -v mpirun >/dev/null && [[ -z "${GPU_SIMULATE_BARE:-}" ]]; then
  mpirun=("${ours[@]}" mpirun)
fi
((${#mpirun[@]})) && mpirun+=(-np 2 --oversubscribe --bind-to none --allow-run-as-root
                              -x LD_LIBRARY_PATH -x OMP_NUM_THREADS=2)
[[ "${mpirun[1]:-}" == OPAL_PREFIX=* ]] && mpirun+=(-x OPAL_PREFIX)
ours_ld=${ours[1]#LD_LIBRARY_PATH=}
export bin logs ours_ld python repo
export -f gpu_tests

# ---- steps -------------------------------------------------------------------------------------
steps_wanted=" ${GPU_STEPS:-doctor tests bench torch graph compile profile fusion tuning resume ranks2 more} "
want() { [[ "$steps_wanted" == *" $1 "* ]]; }
# The loader step's JPEG folder is made in the background while the GPU steps run.
jpegs=/tmp/spotrain-gpu-jpegs
if want loader && [[ -n "$python" ]]; then
  rm -rf "$jpegs"
  (for i in 0 1 2 3; do  # four writers, one class range each
     "$python" "$repo/bench/make_jpeg_folder.py" "$jpegs.$i" --train "${GPU_JPEGS:-1000}" \
       --val 0 --classes 4 --seed "$i" &
   done
   wait
   mkdir -p "$jpegs/train"
   for i in 0 1 2 3; do
     for d in "$jpegs.$i"/train/*; do mv "$d" "$jpegs/train/c$i-$(basename "$d")"; done
   done) > "$logs/make-jpegs.log" 2>&1 &
  jpeg_pid=$!
fi
if [[ -n "$bin" ]]; then
  if ((use_prefix)); then
    t0=$SECONDS
    check_libs > "$logs/libs.log" 2>&1
    record libs "$(tail -n 1 "$logs/libs.log")" $((SECONDS - t0))
    note "libs: $(tail -n 1 "$logs/libs.log")"
  fi
  run_step version 30 "${ours[@]}" "$bin/spotrain" --version
  # The node check first: every op against the float64 reference at each precision, a few
  # ResNet-50 steps against the measured rate with their fast paths' first-use verdicts,
  # NVML's health (spotrain doctor, health/; no timing search, within a minute by design).
  if want doctor; then
    run_step doctor 90 "${ours[@]}" "$bin/spotrain" doctor --device cuda --json "$logs/doctor.json" \
      --ckpt-dir "$out/doctor-ckpt"
    [[ -s "$logs/doctor.log" ]] && restatus "$(laststatus): $(tail -n 1 "$logs/doctor.log")"
    grep -E '^(fail|warn) ' "$logs/doctor.log" | head -n 12 | sed 's/^/    /' || true
  fi
  if want tests; then
    if compgen -G "$bin/test_gpu*" >/dev/null || compgen -G "$bin/tests/test_gpu*" >/dev/null; then
      run_step gpu-tests 150 bash -c gpu_tests
      [[ -s "$logs/gpu-tests-report.txt" ]] && restatus "$(tail -n 1 "$logs/gpu-tests-report.txt")"
    else
      note "no test_gpu* binaries"
      record gpu-tests "none defined" 0
    fi
  fi
fi

# compare_runs NAME RUN_A RUN_B [DATA]: equal weights give equal logits: each run's newest
# checkpoint is evaluated on the CPU (deterministic there) and the logits of the test batches
# compared byte for byte.
compare_runs() {
  local name=$1 data=${4:-synthetic} r d
  for r in a b; do
    "${ours[@]}" "$bin/spotrain" eval --ckpt "$([[ $r == a ]] && echo "$2" || echo "$3")" \
      --data "$data" --test-limit 2000 --device cpu --dump-logits "$logs/$name-$r" \
      > "$logs/$name-eval-$r.log" 2>&1
  done
  if [[ -s "$logs/$name-a.logits.npy" && -s "$logs/$name-b.logits.npy" ]]; then
    cmp -s "$logs/$name-a.logits.npy" "$logs/$name-b.logits.npy" && d="bitwise equal" || d="DIFFER"
  else
    d="FAILED: no logits (see $name-eval-*.log)"
  fi
  record "$name" "$d" 0
}

bench() {  # bench NAME PRECISION CHECKPOINT [EXTRA...]
  local name=$1 prec=$2 ck=$3
  shift 3
  # Captured steps and --fusion auto are the defaults: a row is eager (--no-cuda-graph) and
  # unfused (--fusion none) unless it asks otherwise, as the rows were before those defaults.
  case " $* " in *" --cuda-graph "*) ;; *) set -- --no-cuda-graph "$@" ;; esac
  case " $* " in *" --fusion "*) ;; *) set -- --fusion none "$@" ;; esac
  run_step "bench-$name" 75 "${ours[@]}" "$bin/spotrain" bench --model resnet50 --image-size 224 \
    --batch-size 256 --precision "$prec" --grad-checkpoint "$ck" --steps "$steps" \
    --warmup "$warmup" --device cuda --json "$logs/bench-$name.json" "$@"
}
torch_bench() {  # torch_bench NAME PRECISIONS
  run_step "$1" 150 env PYTHONUNBUFFERED=1 "$python" "$repo/bench/torch_gpu_resnet50.py" \
    --precision "$2" --batch-size 256 --image-size 224 --steps "$steps" \
    --warmup "$warmup" --json "$logs/$1.json"
  [[ $? == 3 ]] && restatus "no CUDA device"
}
if [[ -n "$bin" && -n "$gpu" ]]; then
  # What must run comes first, so that a short budget cuts only the rest: ours and PyTorch's
  # fp16 side by side (ours also end to end: steps queued back to back, no wait between
  # phases), then fp16 replayed from a CUDA Graph (the status says whether the step really was
  # captured); bf16, tf32 and checkpointing after.
  want bench && bench fp16 fp16 none --end-to-end
  want torch && [[ -n "$python" ]] && torch_bench torch fp16
  if want graph; then
    # The default configuration (captured steps, --fusion auto), then captured without fusion.
    bench fp16-default fp16 none --cuda-graph --fusion auto --end-to-end
    bench fp16-graph fp16 none --cuda-graph --end-to-end
    if grep -q '"cuda_graph": true' "$logs/bench-fp16-graph.json" 2>/dev/null; then
      restatus "$(laststatus): captured"
    else
      restatus "$(laststatus): NOT captured ($(grep -m1 -o 'NOT recorded ([^)]*' "$logs/bench-fp16-graph.log" | cut -c15-))"
    fi
  fi
elif [[ -n "$bin" ]]; then
  # Shows that asking for the GPU without one fails cleanly with one line.
  run_step bench-no-gpu 30 "${ours[@]}" "$bin/spotrain" bench --model resnet18 --image-size 32 \
    --batch-size 2 --steps 1 --warmup 0 --device cuda
  grep -q "^error: .*no CUDA device" "$logs/bench-no-gpu.log" &&
    restatus "no CUDA device (one clean error line, exit 1)"
  for b in fp16 fp16-graph; do record "bench-$b" "skipped: no CUDA device" 0; done
  want torch && [[ -n "$python" ]] && torch_bench torch fp16
elif want torch && [[ -n "$python" ]]; then
  torch_bench torch fp16
fi

# PyTorch at its best: torch.compile with mode="reduce-overhead" (its CUDA Graph mode), fp16
# and bf16, in the same run as its eager steps and ours (the warm-up includes compiling).
if want compile && [[ -n "$python" && -n "$gpu" ]]; then
  run_step torch-compile 300 env PYTHONUNBUFFERED=1 "$python" "$repo/bench/torch_gpu_resnet50.py" \
    --precision fp16,bf16 --batch-size 256 --image-size 224 --steps "$steps" \
    --warmup "$(( warmup > 8 ? warmup : 8 ))" --compile reduce-overhead --json "$logs/torch-compile.json"
fi

# Where the time goes: every op timed with CUDA events (ours, with the batch-norm
# configuration cuDNN chose per shape) and the kernels of three steps under torch.profiler
# (PyTorch), at fp16 (and bf16 with "more").
if want profile && [[ -n "$bin" && -n "$gpu" ]]; then
  bench profile-fp16 fp16 none --profile
  bench profile-fp16-auto fp16 none --fusion auto --profile  # each chain's verdict
  [[ -n "$python" ]] && run_step torch-profile 120 env PYTHONUNBUFFERED=1 "$python" \
    "$repo/bench/torch_gpu_resnet50.py" --precision fp16 --batch-size 256 --image-size 224 \
    --steps 5 --warmup 5 --profile --json "$logs/torch-profile.json"
fi

# Conv + batch-norm fusion (--fusion bn): fp16 timed as the plain fp16 run above (also end to
# end), then with the step replayed from a CUDA Graph (cuDNN's graphs recorded too, or NOT
# captured), then profiled, whose chosen: lines say which graphs cuDNN took and which ran.
if want fusion && [[ -n "$bin" && -n "$gpu" ]]; then
  bench fp16-fusion fp16 none --fusion bn --end-to-end
  bench fp16-fusion-graph fp16 none --fusion bn --cuda-graph --end-to-end
  grep -q '"cuda_graph": true' "$logs/bench-fp16-fusion-graph.json" 2>/dev/null &&
    restatus "$(laststatus): captured" || restatus "$(laststatus): NOT captured"
  bench profile-fp16-fusion fp16 none --fusion bn --profile
fi

# What timing the kernels buys: fp16 and --fusion bn with cuDNN's heuristics' first choices
# (the timed ones are the fp16 and fp16-fusion rows); and what the kernel cache buys a restart:
# the same 8-step ResNet-50 training run (the timing happens in its first step) with an
# empty cache, then with the one it left (the steps' durations in the summary).
if want tuning && [[ -n "$bin" && -n "$gpu" ]]; then
  bench fp16-heuristic fp16 none --no-autotune
  bench fp16-fusion-heuristic fp16 none --fusion bn --no-autotune
  rm -rf "$out/run-tuning" "$out/kernel-cache.json"
  tuning=(train --model resnet50 --data synthetic --image-size 224 --train-limit 4096 --test-limit 256
          --batch-size 256 --precision fp16 --steps 8 --log-every 1 --device cuda
          --kernel-cache "$out/kernel-cache.json" --ckpt-dir "")
  run_step train-kernel-cache-cold 120 "${ours[@]}" "$bin/spotrain" "${tuning[@]}"
  run_step train-kernel-cache-warm 120 "${ours[@]}" "$bin/spotrain" "${tuning[@]}"
  grep -q "timed choices for this GPU" "$logs/train-kernel-cache-warm.log" ||
    restatus "$(laststatus): the cache was NOT read"
  cp "$out/kernel-cache.json" "$logs/" 2>/dev/null
  rm -f "$out/kernel-cache.json"
fi

# Levers one by one: fp16 with the block's last BN, Add and ReLU as separate ops, and fp16
# and bf16 with the step captured once as a CUDA Graph and replayed.
if want levers && [[ -n "$bin" && -n "$gpu" ]]; then
  saved=("${ours[@]}")
  ours+=(SPOTRAIN_NO_FUSED_BN_ADD=1)
  bench fp16-unfused fp16 none
  ours=("${saved[@]}")
  bench bf16-graph bf16 none --cuda-graph
fi

# A short training run replayed from a CUDA Graph, stopped by SIGTERM at step 20 (checkpoint,
# exit 75) and resumed: its final weights must equal those of a run straight through (both
# evaluated on the CPU, the logits of the first test batch compared byte for byte).
if want resume && [[ -n "$bin" && -n "$gpu" ]]; then
  common=(train --model resnet20 --data synthetic --train-limit 4096 --test-limit 256
          --batch-size 128 --steps 40 --log-every 10 --device cuda --cuda-graph --deterministic)
  rm -rf "$out"/run-graph-*
  run_step graph-straight 60 "${ours[@]}" "$bin/spotrain" "${common[@]}" --ckpt-dir "$out/run-graph-a"
  grep -q "could not be recorded\|not captured" "$logs/graph-straight.log" && restatus "$(laststatus): NOT captured"
  run_step graph-stop 60 "${ours[@]}" SPOTRAIN_FAULT=term:0:20 "$bin/spotrain" "${common[@]}" \
    --ckpt-dir "$out/run-graph-b"
  (($? == 75)) && restatus "ok: stopped with a checkpoint (exit 75)"
  run_step graph-resume 60 "${ours[@]}" "$bin/spotrain" "${common[@]}" --resume latest \
    --ckpt-dir "$out/run-graph-b"
  compare_runs graph-compare "$out/run-graph-a" "$out/run-graph-b"
  rm -rf "$out"/run-graph-*
fi

# Two ranks on the one GPU (NCCL refuses a shared GPU: --device-comm auto sends the gradients
# through host memory over MPI): fp16, so the ranks agree on each step's overflow verdict;
# rank 1 gets SIGTERM at step 20, both agree to stop and write one checkpoint, then resume.
# Without a GPU (a dry run) the same runs on the CPU, which checks the launcher only.
if want ranks2 && [[ -n "$bin" ]]; then
  if ((${#mpirun[@]})); then
    dev=(--device cuda --precision fp16)
    [[ -z "$gpu" ]] && dev=(--device cpu --precision fp32 --threads 1)
    r2=(train --model resnet20 --data synthetic --train-limit 4096 --test-limit 256 --batch-size 64
        --steps 40 --log-every 10 "${dev[@]}" --ckpt-dir "$out/run-ranks2")
    rm -rf "$out/run-ranks2"
    run_step ranks2-stop 90 "${mpirun[@]}" -x SPOTRAIN_FAULT=term:1:20 "$bin/spotrain" "${r2[@]}"
    (($? == 75)) && restatus "ok: agreed stop with a checkpoint (exit 75)"
    run_step ranks2-resume 90 "${mpirun[@]}" "$bin/spotrain" "${r2[@]}" --resume latest
    st=$(laststatus)
    grep -q "resumed from" "$logs/ranks2-resume.log" || st="$st; did NOT resume"
    grep -q "host memory over" "$logs/ranks2-stop.log" && st="$st; host-staged gradients"
    [[ -z "$gpu" ]] && st="$st (CPU: no CUDA device)"
    restatus "$st"
    rm -rf "$out/run-ranks2"
  else
    note "ranks2: no mpirun (bring openmpi-bin in $debs: scripts/gpu-deps.sh)"
    record ranks2 "skipped: no mpirun" 0
  fi
fi

# Only if time is left: bf16, tf32 and fp16 with stage and selective gradient checkpointing,
# PyTorch's bf16 and tf32, and the bf16 profile.
if want more && [[ -n "$bin" && -n "$gpu" ]]; then
  bench bf16 bf16 none
  bench bf16-default bf16 none --cuda-graph --fusion auto
  bench tf32 tf32 none
  bench fp16-ckpt fp16 stage
  bench fp16-selective fp16 selective
  [[ -n "$python" ]] && torch_bench torch-more bf16,tf32
  want profile && bench profile-bf16 bf16 none --profile
fi

# Through the real loader: JPEG decode, RandomResizedCrop and flip on the CPU cores, pinned
# 8-bit batches normalized on the GPU, at fp16, eager and in the default configuration (against
# fp16-default's synthetic rate: the goal is 95%); data wait says whether the loader keeps up.
if want loader && [[ -n "$bin" && -n "$gpu" && -n "${jpeg_pid:-}" ]]; then
  wait "$jpeg_pid"
  n=$(find "$jpegs/train" -name '*.JPEG' 2>/dev/null | wc -l)
  note "loader: $n JPEG files in $jpegs"
  bench loader-fp16 fp16 none --data "imagefolder:$jpegs" --workers "$(( $(nproc) - 1 ))"
  bench loader-fp16-default fp16 none --data "imagefolder:$jpegs" --workers "$(( $(nproc) - 1 ))" \
    --cuda-graph --fusion auto --end-to-end
fi

# Fashion-MNIST on the GPU: the demo recipe (accuracy against the CPU's), then two short
# --deterministic runs whose checkpoints must be bitwise equal.
fmnist=${GPU_FMNIST:-/usr/share/datasets/fashion-mnist}
if want train && [[ -n "$bin" && -n "$gpu" ]]; then
  run_step train-fmnist 150 "${ours[@]}" "$bin/spotrain" train --model resnet20 \
    --data "fashion-mnist:$fmnist" --epochs 6 --batch-size 128 --lr 0.1 --device cuda \
    --metrics "$logs/train-fmnist.jsonl" --ckpt-dir "$out/run-fmnist"
  acc=$(grep -oE '"test_top1": *[0-9.]+' "$logs/train-fmnist.jsonl" 2>/dev/null | tail -1 | grep -oE '[0-9.]+$')
  [[ -n "$acc" ]] && restatus "$(laststatus): test top-1 $acc"
  for r in 1 2; do
    run_step "det-$r" 60 "${ours[@]}" "$bin/spotrain" train --model resnet20 \
      --data "fashion-mnist:$fmnist" --steps 60 --batch-size 128 --lr 0.1 --device cuda \
      --deterministic --ckpt-dir "$out/run-det-$r"
  done
  compare_runs det-compare "$out/run-det-1" "$out/run-det-2" "fashion-mnist:$fmnist"
  rm -rf "$out"/run-fmnist "$out"/run-det-*
fi

# ---- the table -------------------------------------------------------------------------------
"${python:-python3}" - "$logs" "$gpu" "$out/results.json" > "$out/summary.txt" <<'EOF'
import json, os, re, sys
out, gpu, results = sys.argv[1], sys.argv[2], sys.argv[3]
print(f"GPU check ({gpu or 'no CUDA device'})")
for line in open(os.path.join(out, "version.log")) if os.path.exists(os.path.join(out, "version.log")) else []:
    print("  " + line.rstrip())
print(f"{'step':<16} {'seconds':>7}  status")
for line in open(os.path.join(out, "steps.tsv")):
    name, status, secs = line.rstrip("\n").split("\t")
    print(f"{name:<16} {secs:>7}  {status}")
gpu_tests = {}
if os.path.exists(os.path.join(out, "gpu-tests.json")):
    gpu_tests = json.load(open(os.path.join(out, "gpu-tests.json")))
    for p in gpu_tests.get("problems", [])[:40]:
        print(f"  gpu test {p['status']}: {p['test']}" + (f" ({p['detail'][:120]})" if p["detail"] else ""))
if os.path.exists(os.path.join(out, "libs.log")):
    for l in open(os.path.join(out, "libs.log")).read().splitlines()[:-1][:10]:
        print(f"  libs: {l}")
rows, torch = [], {}
for tj in (os.path.join(out, "torch.json"), os.path.join(out, "torch-more.json")):
    if os.path.exists(tj):
        for r in json.load(open(tj)):
            torch[r["precision"]] = r
compiled = []
tc = os.path.join(out, "torch-compile.json")
if os.path.exists(tc):
    compiled = json.load(open(tc))
names = ["fp16-default", "fp16", "fp16-graph", "fp16-fusion", "fp16-fusion-graph", "bf16-default",
         "bf16", "tf32", "fp16-ckpt", "loader-fp16", "loader-fp16-default"]
names += sorted(f[6:-5] for f in os.listdir(out)
                if f.startswith("bench-") and f.endswith(".json") and f[6:-5] not in names)
for name in names:
    f = os.path.join(out, f"bench-{name}.json")
    if os.path.exists(f):
        r = json.load(open(f))
        r["name"] = name
        rows.append(r)
version = os.path.join(out, "version.log")
json.dump({"gpu": gpu or "no CUDA device",
           "version": open(version).read().splitlines() if os.path.exists(version) else [],
           "steps": [l.rstrip("\n").split("\t") for l in open(os.path.join(out, "steps.tsv"))],
           "gpu_tests": gpu_tests,
           "spotrain": rows, "pytorch": list(torch.values()) + compiled}, open(results, "w"), indent=2)
if rows or torch:
    print()
    print("ResNet-50 224x224, batch 256, synthetic data: training images/s (median; p10-p90)")
    print(f"{'engine':<9} {'run':<21} {'ckpt':<9} {'images/s':>9} {'p10-p90':>13} {'peak GiB':>9} {'wait':>5} {'vs torch':>8} {'vs best':>8}")
    # PyTorch's best at each precision: eager or compiled, whichever was faster in this run.
    best = {}
    for t in list(torch.values()) + compiled:
        if t["images_per_sec"] > best.get(t["precision"], {}).get("images_per_sec", 0):
            best[t["precision"]] = t
    gib = lambda b: f"{b / 2**30:.2f}" if b else "-"
    for r in rows:
        t = torch.get(r["precision"])
        plain = r["grad_checkpoint"] == "none" and r.get("data", "synthetic") == "synthetic" \
            and not r.get("profile")
        ratio = f"{r['images_per_sec'] / t['images_per_sec']:.2f}x" if t and plain else ""
        b = best.get(r["precision"])
        vbest = f"{r['images_per_sec'] / b['images_per_sec']:.2f}x" if b and plain else ""
        ph = r.get("phases") or {}
        step = sum(v for v in ph.values() if isinstance(v, (int, float)))
        wait = f"{100 * ph.get('data', 0) / step:.0f}%" if step and r.get("data", "synthetic") != "synthetic" else ""
        print(f"{'spotrain':<9} {r['name']:<21} {r['grad_checkpoint']:<9} {r['images_per_sec']:>9.1f} "
              f"{r['images_per_sec_p10']:>6.0f}-{r['images_per_sec_p90']:<6.0f} {gib(r.get('peak_memory_bytes')):>9} {wait:>5} {ratio:>8} {vbest:>8}")
        e2e = r.get("images_per_sec_end_to_end")
        if isinstance(e2e, (int, float)):
            ratio = f"{e2e / t['images_per_sec']:.2f}x" if t and plain else ""
            print(f"{'spotrain':<9} {r['name'] + ' e2e':<21} {r['grad_checkpoint']:<9} {e2e:>9.1f} "
                  f"{'':>13} {'':>9} {'':>5} {ratio:>8}")
        if r.get("name", "").endswith("-graph") and not r.get("cuda_graph"):
            print(f"          ({r['name']}: the step was NOT captured; these are eager steps)")
        # A captured step's memory against the same run's eager steps (the goal: at most 1.15x).
        eager = next((e for e in rows if e["name"] == r["name"][:-6]), None) if r["name"].endswith("-graph") else None
        if eager and r.get("cuda_graph") and eager.get("peak_memory_bytes") and eager.get("reserved_memory_bytes"):
            print(f"          ({r['name']} vs {eager['name']}: peak {r['peak_memory_bytes'] / eager['peak_memory_bytes']:.2f}x, "
                  f"reserved {r.get('reserved_memory_bytes', 0) / eager['reserved_memory_bytes']:.2f}x)")
    for p, t in list(torch.items()) + [(t["precision"] + "-compile-" + t.get("compile_mode", "default"), t)
                                        for t in compiled]:
        # A replayed CUDA Graph allocates nothing after the warm-up that reset the peak: its
        # memory is the graph pool's, which only the reserved peak shows.
        graphs = "reduce-overhead" in t.get("compile_mode", "")
        mem = gib(t.get("peak_reserved_bytes")) + " r" if graphs else gib(t.get("peak_memory_bytes"))
        print(f"{'pytorch':<9} {p:<21} {'none':<9} {t['images_per_sec']:>9.1f} "
              f"{t['images_per_sec_p10']:>6.0f}-{t['images_per_sec_p90']:<6.0f} {mem:>9}")
    if any("reduce-overhead" in t.get("compile_mode", "") for t in compiled):
        print("  (peak GiB 'r': reserved, the CUDA Graph pool included)")
    for r in rows:
        ph = r.get("phases") or {}
        ops = (r.get("profile") or {}).get("ops") or []
        if ops:
            inside = sum(o["ms_per_step"] for o in ops)
            print(f"  profile {r['name']}: {inside:.1f} ms/step inside ops; " +
                  ", ".join(f"{o['op']} {o['ms_per_step']:.1f}" for o in ops[:8]))
        choices = (r.get("profile") or {}).get("choices") or []
        if choices:
            bn = [c for c in choices if c.startswith("batchnorm")]
            odd = [c for c in choices if "fallback" in c or "refuse" in c]
            def verdict(c, g):  # "accepted (engine 12, 2 MiB, ..., ran" / "refused (..." / ""
                part = c.split(f", {g} graph: ", 1)
                return part[1].split(")")[0] if len(part) > 1 else ""
            graphs = ["conv+stats", "bn-relu+conv+stats", "bn-relu+conv", "bn-relu+wgrad",
                      "dgrad+drelu+dbn"]
            took = ", ".join(f"{g} {sum(verdict(c, g).startswith('accepted') for c in choices)}"
                             f" ({sum(verdict(c, g).endswith(', ran') for c in choices)} ran)"
                             for g in graphs)
            planning = sum(float(m) for c in choices for m in re.findall(r"planned in ([0-9.]+) s", c))
            graphs_said = (f"cuDNN's fusion graphs accepted (ran) per shape: {took}, planned in "
                           f"{planning:.1f} s in all; " if any(" graph: " in c for c in choices) else "")
            print(f"  chosen {r['name']}: {len(choices) - len(bn)} conv and {len(bn)} batch-norm shapes; "
                  f"{graphs_said}{len(odd)} with a fallback or refusal" + (":" if odd else ""))
            for c in odd[:10]:
                print("    " + c[:160])
        if ph:
            print(f"  phases {r['precision']}/{r['grad_checkpoint']} (ms/step): " +
                  ", ".join(f"{k} {v * 1000:.1f}" for k, v in ph.items() if isinstance(v, (int, float))))
# Silent slow paths: every "runs in fp32" note any step printed.
notes = set()
for f in sorted(os.listdir(out)):
    if f.endswith(".log"):
        for line in open(os.path.join(out, f), errors="replace"):
            if "runs in fp32" in line:
                notes.add(line.strip())
if notes:
    print()
    print(f"{len(notes)} fp32 fallback note(s):")
    for n in sorted(notes)[:20]:
        print("  " + n[:200])
# The last line (a log's tail) is the verdict, with the first step that did not end well.
bad = [(n, st) for n, st, _ in (l.rstrip("\n").split("\t") for l in open(os.path.join(out, "steps.tsv")))
       if not (st.startswith("ok") or st.startswith("prebuilt") or st.startswith("skipped: no CUDA")
               or st.startswith("system packages") or st.startswith("no CUDA device")
               or st.startswith("bitwise equal"))]
print()
print(f"gpu-check: {len(bad)} step(s) did not end ok; the first: {bad[0][0]}: {bad[0][1]}" if bad
      else "gpu-check: every step ended ok")
EOF
note "finished in $((SECONDS - start)) s; summary.txt, results.json and logs.tar.gz in $out"
tar -czf "$out/logs.tar.gz" -C "$out" logs && [[ -z "${GPU_KEEP_LOGS:-}" ]] && rm -rf "$logs"
echo
cat "$out/summary.txt"
