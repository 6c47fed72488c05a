#!/usr/bin/env bash
# The container image (examples/resnet50/launch/Dockerfile), built CPU-only
# (--build-arg SPOTRAIN_CUDA=OFF) with Podman or Docker and smoke-tested: `--version`, the
# process is not root, three training steps on Fashion-MNIST into a mounted folder, `report`
# on that run folder (an HTML page with Chart.js embedded), sshd as the unprivileged user
# through spotrain-worker with keys mounted as the MPI Operator mounts them, and a 2-rank mpirun
# over ssh between two such worker containers. Prints the build time, the image's size and that
# of the build stage (compilers, headers, source and build tree: what a single-stage image
# holds).
#
#   tests/test_image.sh [SOURCE_DIR]
#
# The base image (BASE_IMAGE of the Dockerfile) is SPOTRAIN_IMAGE_BASE when set, else
# localhost/spotrain-base:bookworm, made on the first run with debootstrap (a minimal Debian 12,
# about 1 minute; as root) and kept, like the build's layers, so a second run is quick.
# Exits 77 with one line saying why (skipped) when no engine can run a container here, or
# when the base image is missing and cannot be made.
#
# Settings (environment):
#   SPOTRAIN_IMAGE_ENGINE  podman or docker (default: the first of them that runs a container)
#   SPOTRAIN_IMAGE_BASE    base image to build from (default: see above)
#   SPOTRAIN_IMAGE_MIRROR  Debian mirror for debootstrap (default http://deb.debian.org/debian)
#   SPOTRAIN_IMAGE_TAG     tag of the image built (default localhost/spotrain:test-cpu)
#   SPOTRAIN_IMAGE_JOBS    compile jobs in the build (default: every core)
set -uo pipefail

src=$(cd "${1:-$(dirname "$0")/..}" && pwd)
dockerfile=$src/examples/resnet50/launch/Dockerfile
ignorefile=$src/examples/resnet50/launch/Dockerfile.dockerignore
base=${SPOTRAIN_IMAGE_BASE:-localhost/spotrain-base:bookworm}
mirror=${SPOTRAIN_IMAGE_MIRROR:-http://deb.debian.org/debian}
tag=${SPOTRAIN_IMAGE_TAG:-localhost/spotrain:test-cpu}
jobs=${SPOTRAIN_IMAGE_JOBS:-}

skip() { echo "SKIPPED: $*"; exit 77; }
fail() { echo "FAILED: $*" >&2; exit 1; }
# The last non-empty line of a command's output, for one-line reasons.
last_line() { grep -v '^[[:space:]]*$' "$1" | tail -n 1; }

work=$(mktemp -d "${TMPDIR:-/tmp}/spotrain-image.XXXXXX")
trap 'rm -rf "$work"' EXIT
log=$work/log

# ---- a container engine that can run a container here ----
engines=()
if [[ -n "${SPOTRAIN_IMAGE_ENGINE:-}" ]]; then
  engines=("$SPOTRAIN_IMAGE_ENGINE")
else
  command -v podman >/dev/null && engines+=(podman)
  command -v docker >/dev/null && engines+=(docker)
fi
((${#engines[@]})) || skip "no container engine (podman or docker) on PATH"

have_image() { "${eng[@]}" image inspect "$1" >/dev/null 2>&1; }

# Makes $base with debootstrap (minbase, Debian 12, with the updates and security suites).
make_base() {
  [[ $(id -u) -eq 0 ]] || { why="base image $base missing; making it with debootstrap needs root"; return 1; }
  command -v debootstrap >/dev/null || { why="base image $base missing and debootstrap not installed"; return 1; }
  local root=$work/rootfs t0=$SECONDS
  echo "making the base image $base with debootstrap from $mirror"
  if ! debootstrap --variant=minbase bookworm "$root" "$mirror" >"$log" 2>&1; then
    why="debootstrap failed: $(last_line "$log")"; return 1
  fi
  rm -f "$root/etc/apt/sources.list"
  printf '%s\n' 'Types: deb' "URIs: $mirror" 'Suites: bookworm bookworm-updates' 'Components: main' \
    'Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg' '' \
    'Types: deb' 'URIs: http://deb.debian.org/debian-security' 'Suites: bookworm-security' \
    'Components: main' 'Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg' \
    >"$root/etc/apt/sources.list.d/debian.sources"
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
  if ! tar -C "$root" -c . | "${eng[@]}" import - "$base" >"$log" 2>&1; then
    why="importing the base image failed: $(last_line "$log")"; return 1
  fi
  rm -rf "$root"
  echo "base image made in $((SECONDS - t0)) s"
}

# Finds options with which the engine runs a container: none, or for Podman where crun or the
# default limits are refused (cgroup v1/v2 hybrids, no CAP_SYS_RESOURCE), runc and the limits
# this shell has (nproc at most pid_max).
probe() {
  local -a tries=("")
  if [[ ${eng[0]} == podman ]]; then
    command -v runc >/dev/null && tries+=("--runtime runc")
    local nproc pid_max limits
    nproc=$(ulimit -Hu)
    pid_max=$(cat /proc/sys/kernel/pid_max 2>/dev/null || echo 32768)
    [[ $nproc == unlimited || $nproc -gt $pid_max ]] && nproc=$pid_max
    limits="--ulimit nofile=$(ulimit -Sn):$(ulimit -Hn) --ulimit nproc=$nproc:$nproc"
    tries+=("$limits")
    command -v runc >/dev/null && tries+=("--runtime runc $limits")
  fi
  local t
  for t in "${tries[@]}"; do
    read -r -a opts <<<"$t"
    if "${eng[@]}" run --rm --network none "${opts[@]}" "$base" true >"$log" 2>&1; then
      return 0
    fi
    why="${eng[0]} cannot run a container: $(last_line "$log")"
  done
  return 1
}

eng=() opts=() why="" found=0
for e in "${engines[@]}"; do
  eng=("$e")
  if [[ $e == docker ]] && ! docker info >"$log" 2>&1; then
    why="docker has no daemon to talk to: $(grep -m1 -i -E 'error|cannot' "$log" || last_line "$log")"
    continue
  fi
  if ! have_image "$base"; then
    make_base || continue
  fi
  probe && { found=1; break; }
done
((found)) || skip "$why"
# Podman's --runtime is a global option; the rest go to run and build.
if [[ "${opts[0]:-}" == --runtime ]]; then
  eng+=("${opts[@]:0:2}")
  opts=("${opts[@]:2}")
fi
echo "engine: ${eng[*]} ${opts[*]}; base image: $base"

# ---- build (CPU-only) ----
build_cmd=("${eng[@]}" build "${opts[@]}" -f "$dockerfile" --build-arg "BASE_IMAGE=$base"
           --build-arg SPOTRAIN_CUDA=OFF --build-arg "BUILD_JOBS=$jobs")
if [[ ${eng[0]} == podman ]]; then
  # Podman reads no <Dockerfile>.dockerignore by itself; the host network saves setting one up.
  build_cmd+=(--ignorefile "$ignorefile" --network host)
else
  export DOCKER_BUILDKIT=1
fi
echo "building $tag (CPU-only) ..."
t0=$SECONDS
"${build_cmd[@]}" -t "$tag" "$src" >"$work/build.log" 2>&1 \
  || { tail -n 30 "$work/build.log" >&2; fail "image build failed"; }
build_s=$((SECONDS - t0))
# The build stage's image: with Podman the last layer made before the final stage starts (as
# its build output says); with Docker the stage built alone, from the cache.
if [[ ${eng[0]} == podman ]]; then
  stage=$(awk '/^\[2\/2\] STEP/ {exit} /^--> [0-9a-f]+$/ {id = $2} END {print id}' "$work/build.log")
else
  stage=$tag-buildstage
  "${build_cmd[@]}" --target build -t "$stage" "$src" >"$log" 2>&1 || stage=""
fi
size_mb() { "${eng[@]}" image inspect --format '{{.Size}}' "$1" 2>/dev/null | awk '{printf "%.0f MB", $1 / 1e6}'; }
echo "built in ${build_s} s; image $tag: $(size_mb "$tag");" \
     "build stage (compilers, headers, source, build tree): $( [[ -n $stage ]] && size_mb "$stage" || echo n/a)"

run() { "${eng[@]}" run --rm --network none "${opts[@]}" "$@"; }
status=0
check() {  # check NAME COMMAND...: runs it, says ok or FAILED with its output
  local name=$1; shift
  if "$@" >"$log" 2>&1; then
    echo "ok: $name"
  else
    echo "FAILED: $name"; sed 's/^/  | /' "$log" | tail -n 20; status=1
  fi
}

# ---- smoke tests ----
version_ok() { run "$tag" --version | tee /dev/stderr | grep -q '^spotrain [0-9]'; }
check "--version" version_ok
user=$("${eng[@]}" image inspect --format '{{.Config.User}}' "$tag")
uid=$(run --entrypoint id "$tag" -u 2>"$log")
if [[ -n "$user" && "${user%%:*}" != 0 && "${user%%:*}" != root && "$uid" =~ ^[0-9]+$ && "$uid" != 0 ]]; then
  echo "ok: runs as uid $uid (image user $user)"
else
  echo "FAILED: image user '$user', uid in the container '$uid' $(last_line "$log")"; status=1
fi

out=$work/out
mkdir -p "$out" && chmod 777 "$out"   # the container writes as its own (non-root) user
check "train: 3 steps on Fashion-MNIST" run -v "$out:/workspace/out" "$tag" \
  train --model resnet20 --data fashion-mnist --steps 3 --train-limit 256 --test-limit 64 \
  --threads 2 --ckpt-dir out/r20
check "report on the run folder" run -v "$out:/workspace/out" "$tag" \
  report out/r20 -o out/report.html
if [[ -s "$out/report.html" ]] && grep -q 'Chart.js v' "$out/report.html"; then
  echo "ok: report.html ($(stat -c %s "$out/report.html") bytes) embeds Chart.js"
else
  echo "FAILED: no report.html with Chart.js in it"; status=1
fi

# sshd as the image's user, started by spotrain-worker (its SSHD), reached with the image's
# ssh client settings, as an MPIJob launcher reaches its workers. The keys are mounted the way
# the MPI Operator mounts its Secret at a sshAuthMountPath other than /root/.ssh: read-only,
# owned by root, mode 0644 (id_rsa, id_rsa.pub, authorized_keys).
keys=$work/ssh
mkdir -p "$keys" && chmod 755 "$keys"
check "ssh keys made" run --user 0 -v "$keys:/keys" --entrypoint /bin/bash "$tag" -c '
  ssh-keygen -q -t ecdsa -b 521 -N "" -f /keys/id_rsa && cp /keys/id_rsa.pub /keys/authorized_keys
  chown 0:0 /keys/* && chmod 644 /keys/*'
check "sshd as non-root via spotrain-worker, ssh to it" \
  run -v "$keys:/home/spotrain/.ssh:ro" --entrypoint /bin/bash "$tag" -c '
  spotrain-worker & worker=$!
  for i in $(seq 100); do ssh -o BatchMode=yes localhost true 2>/dev/null && break; sleep 0.1; done
  out=$(ssh -o BatchMode=yes localhost "id -u; spotrain --version")
  kill -TERM $worker; wait $worker   # (its exit status on a stop is its own business)
  echo "$out"; [[ $(head -n 1 <<<"$out") == "$(id -u)" && $(id -u) != 0 && $out == *"spotrain "* ]]'

# Two ranks over ssh, as in an MPIJob: two worker containers run spotrain-worker (sshd as the
# image's user) and a launcher container runs mpirun with the same keys, all as that user, on
# the engine's default network (the check is skipped where containers cannot reach each other).
workers=()
trap 'rm -rf "$work"; ((${#workers[@]})) && "${eng[@]}" rm -f "${workers[@]}" >/dev/null 2>&1' EXIT
ips=()
for i in 1 2; do
  name=spotrain-test-worker$i-$$
  "${eng[@]}" run -d "${opts[@]}" --name "$name" -v "$keys:/home/spotrain/.ssh:ro" \
    --entrypoint /usr/bin/tini "$tag" -- /usr/local/bin/spotrain-worker >"$log" 2>&1 || break
  workers+=("$name")
  ips+=("$("${eng[@]}" inspect -f '{{.NetworkSettings.IPAddress}}' "$name" 2>/dev/null)")
done
if ((${#ips[@]} == 2)) && [[ -n ${ips[0]} && -n ${ips[1]} ]]; then
  check "mpirun over ssh: 2 ranks in 2 worker containers, 2 steps" \
    "${eng[@]}" run --rm "${opts[@]}" -v "$keys:/home/spotrain/.ssh:ro" --entrypoint /bin/bash "$tag" -c "
    set -o pipefail
    for ip in ${ips[*]}; do
      for i in \$(seq 100); do ssh -o BatchMode=yes \$ip true 2>/dev/null && break; sleep 0.1; done
    done
    mpirun -np 2 --host ${ips[0]}:1,${ips[1]}:1 -x OMP_NUM_THREADS=1 \
      spotrain train --model resnet20 --data fashion-mnist --steps 2 --train-limit 128 \
      --test-limit 32 --batch-size 16 --threads 1 --ckpt-dir /tmp/r20 2>&1 | tee /tmp/mpi.log &&
    grep -q 'over 2 ranks' /tmp/mpi.log"
else
  echo "skipped: mpirun over ssh (worker containers without addresses on the default network: $(last_line "$log"))"
fi

exit $status
