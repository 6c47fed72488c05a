#!/usr/bin/env bash
# The GPU check: on a machine with one NVIDIA GPU, builds spotrain with the CUDA backend, runs
# the `gpu` tests, then ResNet-50 training throughput (224x224, batch 256, synthetic) with
# `spotrain bench` at fp16 / bf16 / tf32 and fp16 with gradient checkpointing, and PyTorch
# (bench/torch_gpu_resnet50.py) in the same run; prints a short table last. Everything ends
# within GPU_BUDGET_S (470) seconds.
#
# Made for a bare CUDA machine: nvcc, PyTorch, cmake and ninja present; cuDNN, cuBLAS and NCCL
# only inside Python's site-packages/nvidia/* wheels; no Debian packages and no network. The
# Debian packages come from .gpu-debs/ (scripts/gpu-deps.sh, run beforehand on Debian 12) and
# are unpacked with dpkg -x into a private prefix; nothing is installed. Without a GPU every
# step up to the GPU ones still runs, and those report "no CUDA device".
#
# Results: $OUT/summary.txt (the table), results.json (all figures and versions) and
# logs.tar.gz (logs/: machine, configure, build, version, gpu-tests, bench-*, torch ...).
#
# Environment: OUT (gpu-out), GPU_DEBS (.gpu-debs), GPU_PREFIX (/tmp/spotrain-gpu-prefix),
# GPU_BUILD (build-gpu), GPU_BUDGET_S (470), GPU_JOBS (all cores), GPU_PYTHON (the python3
# with PyTorch), GPU_BENCH_STEPS (20), GPU_BENCH_WARMUP (5), GPU_KEEP_LOGS=1 (keep $OUT/logs/
# unpacked too), GPU_SIMULATE_BARE=1 (dry run on a Debian machine that has the packages
# installed: CMake is kept from finding anything under /usr, so the prefix is used).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
repo=$PWD
out=${OUT:-gpu-out}
mkdir -p "$out" && out=$(cd "$out" && pwd)
# Every log and JSON file goes to $out/logs; at the end they are packed into logs.tar.gz next
# to summary.txt and results.json (the device tool brings back at most 8 files).
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
# CMAKE_POLICY_VERSION_MINIMUM: a pip-installed CMake 4 still reads Debian's older
# package configuration files.
cmake_args=(-DCMAKE_BUILD_TYPE=Release -DSPOTRAIN_CUDA=ON -DSPOTRAIN_BUILD_BENCH=OFF
            -DSPOTRAIN_BUILD_TESTS=ON -DCMAKE_POLICY_VERSION_MINIMUM=3.5)
[[ -n "$python" ]] && cmake_args+=(-DSPOTRAIN_CUDA_PYTHON="$python")
[[ -n "$nvcc" ]] && cmake_args+=(-DCMAKE_CUDA_COMPILER="$nvcc")
if ((use_prefix)); then
  libs="$P/lib/$arch:$P/lib/$arch/openmpi/lib:$P/lib/$arch/hdf5/serial"
  export LD_LIBRARY_PATH="$libs${wheel_libs:+:$wheel_libs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  zlib=$P/lib/$arch/libz.so
  if [[ ! -e "$zlib" ]]; then  # the -dev symlink points at the runtime zlib1g, not unpacked
    zlib=$(ldconfig -p 2>/dev/null | awk '/libz\.so\.1 .*x86-64/{print $NF; exit}')
    [[ -z "$zlib" ]] && zlib=$(ls /lib/$arch/libz.so.1 /usr/lib/$arch/libz.so.1 2>/dev/null | head -1)
  fi
  cmake_args+=(-DCMAKE_PREFIX_PATH="$P"
    -DDNNL_INCLUDE_DIR="$P/include" -DDNNL_LIBRARY="$P/lib/$arch/libdnnl.so"
    -DMPI_SKIP_COMPILER_WRAPPER=ON -DMPI_C_HEADER_DIR="$P/lib/$arch/openmpi/include"
    -DMPI_C_LIB_NAMES=mpi -DMPI_mpi_LIBRARY="$P/lib/$arch/openmpi/lib/libmpi.so"
    -DMPIEXEC_EXECUTABLE=/bin/false
    -DHDF5_ROOT="$P/lib/$arch/hdf5/serial" -DHDF5_NO_FIND_PACKAGE_CONFIG_FILE=ON
    -DHDF5_C_COMPILER_EXECUTABLE=/bin/false
    -DZLIB_INCLUDE_DIR="$P/include" -DZLIB_LIBRARY="$zlib"
    -DGTest_DIR="$P/lib/$arch/cmake/GTest" -Dnlohmann_json_DIR="$P/share/cmake/nlohmann_json"
    -DCLI11_DIR="$P/share/cmake/CLI11"
    -DCMAKE_CXX_FLAGS="-isystem $P/include -isystem $P/include/hdf5/serial"
    -DCMAKE_CUDA_FLAGS="-isystem $P/include")
  if [[ -n "${GPU_SIMULATE_BARE:-}" ]]; then  # dry run: nothing from /usr may be found
    cmake_args+=(-DCMAKE_SYSTEM_IGNORE_PREFIX_PATH=/usr
      "-DCMAKE_IGNORE_PATH=/usr/include;/usr/lib/$arch;/usr/share/cmake;/usr/lib/$arch/cmake")
  fi
elif [[ -n "$wheel_libs" ]]; then
  export LD_LIBRARY_PATH="$wheel_libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)

# ---- configure, build, gpu tests ---------------------------------------------------------
built=0
if run_step configure 120 cmake -S "$repo" -B "$build" "${generator[@]}" "${cmake_args[@]}"; then
  grep -E "spotrain: CUDA|Found (MPI_C|HDF5|GTest|ZLIB)" "$logs/configure.log" | sed 's/^/    /'
  targets=(spotrain)
  for t in $(cmake --build "$build" --target help 2>/dev/null | grep -oE '(^|[ :.])test_gpu[A-Za-z0-9_]*' |
             tr -d ' :.' | sort -u); do targets+=("$t"); done
  note "building ${targets[*]} with $jobs jobs"
  run_step build 330 cmake --build "$build" --parallel "$jobs" --target "${targets[@]}" && built=1
fi
if ((built)); then
  run_step version 30 "$build/spotrain" --version
  if ((${#targets[@]} > 1)); then
    run_step gpu-tests 150 ctest --test-dir "$build" -L gpu --output-on-failure --timeout 120
    # The status says how many ran and how many skipped (no CUDA device).
    tally=$(grep -oE '[0-9]+% tests passed, [0-9]+ tests failed out of [0-9]+' "$logs/gpu-tests.log" | tail -1)
    skipped=$(grep -c '(Skipped)' "$logs/gpu-tests.log")
    [[ -n "$tally" ]] && restatus "$(laststatus): $tally, $skipped skipped"
  else
    note "no test_gpu* targets in this tree"
    record gpu-tests "none defined" 0
  fi
fi

# ---- benchmarks ----------------------------------------------------------------------------
bench() {  # bench NAME PRECISION CHECKPOINT
  run_step "bench-$1" 75 "$build/spotrain" bench --model resnet50 --image-size 224 \
    --batch-size 256 --precision "$2" --grad-checkpoint "$3" --steps "$steps" \
    --warmup "$warmup" --device cuda --json "$logs/bench-$1.json"
}
if ((built)) && [[ -n "$gpu" ]]; then
  bench fp16 fp16 none
  bench bf16 bf16 none
  bench tf32 tf32 none
  bench fp16-ckpt fp16 stage
elif ((built)); then
  # Shows that asking for the GPU without one fails cleanly with one line.
  run_step bench-no-gpu 30 "$build/spotrain" bench --model resnet18 --image-size 32 \
    --batch-size 2 --steps 1 --warmup 0 --device cuda
  grep -q "^error: .*no CUDA device" "$logs/bench-no-gpu.log" &&
    restatus "no CUDA device (one clean error line, exit 1)"
  for b in fp16 bf16 tf32 fp16-ckpt; do record "bench-$b" "skipped: no CUDA device" 0; done
fi
if [[ -n "$python" ]]; then
  run_step torch 150 env PYTHONUNBUFFERED=1 "$python" "$repo/bench/torch_gpu_resnet50.py" \
    --precision fp16,bf16,tf32 --batch-size 256 --image-size 224 --steps "$steps" \
    --warmup "$warmup" --json "$logs/torch.json"
  [[ $? == 3 ]] && restatus "no CUDA device"
fi

# ---- the table -------------------------------------------------------------------------------
"${python:-python3}" - "$logs" "$gpu" "$out/results.json" > "$out/summary.txt" <<'EOF'
import json, os, sys
out, gpu, results = sys.argv[1], sys.argv[2], sys.argv[3]
print(f"GPU check ({gpu or 'no CUDA device'})")
for line in open(os.path.join(out, "version.log")) if os.path.exists(os.path.join(out, "version.log")) else []:
    print("  " + line.rstrip())
print(f"{'step':<16} {'seconds':>7}  status")
for line in open(os.path.join(out, "steps.tsv")):
    name, status, secs = line.rstrip("\n").split("\t")
    print(f"{name:<16} {secs:>7}  {status}")
rows, torch = [], {}
tj = os.path.join(out, "torch.json")
if os.path.exists(tj):
    for r in json.load(open(tj)):
        torch[r["precision"]] = r
for name in ("fp16", "bf16", "tf32", "fp16-ckpt"):
    f = os.path.join(out, f"bench-{name}.json")
    if os.path.exists(f):
        rows.append(json.load(open(f)))
version = os.path.join(out, "version.log")
json.dump({"gpu": gpu or "no CUDA device",
           "version": open(version).read().splitlines() if os.path.exists(version) else [],
           "steps": [l.rstrip("\n").split("\t") for l in open(os.path.join(out, "steps.tsv"))],
           "spotrain": rows, "pytorch": list(torch.values())}, open(results, "w"), indent=2)
if rows or torch:
    print()
    print("ResNet-50 224x224, batch 256, synthetic data: training images/s (median; p10-p90)")
    print(f"{'engine':<9} {'precision':<9} {'ckpt':<6} {'images/s':>9} {'p10-p90':>13} {'peak GiB':>9} {'vs torch':>8}")
    gib = lambda b: f"{b / 2**30:.2f}" if b else "-"
    for r in rows:
        t = torch.get(r["precision"])
        ratio = f"{r['images_per_sec'] / t['images_per_sec']:.2f}x" if t and r["grad_checkpoint"] == "none" else ""
        print(f"{'spotrain':<9} {r['precision']:<9} {r['grad_checkpoint']:<6} {r['images_per_sec']:>9.1f} "
              f"{r['images_per_sec_p10']:>6.0f}-{r['images_per_sec_p90']:<6.0f} {gib(r.get('peak_memory_bytes')):>9} {ratio:>8}")
    for p, t in torch.items():
        print(f"{'pytorch':<9} {p:<9} {'none':<6} {t['images_per_sec']:>9.1f} "
              f"{t['images_per_sec_p10']:>6.0f}-{t['images_per_sec_p90']:<6.0f} {gib(t.get('peak_memory_bytes')):>9}")
EOF
note "finished in $((SECONDS - start)) s; summary.txt, results.json and logs.tar.gz in $out"
tar -czf "$out/logs.tar.gz" -C "$out" logs && [[ -z "${GPU_KEEP_LOGS:-}" ]] && rm -rf "$logs"
echo
cat "$out/summary.txt"
