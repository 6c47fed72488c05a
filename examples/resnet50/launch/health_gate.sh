#!/usr/bin/env bash
# The health gate before a multi-node start (mpirun.sh runs it with HEALTH_CHECK=1; it runs
# alone too): `spotrain doctor` on every host listed, all at once, each within HEALTH_TIMEOUT;
# then the link check, `spotrain doctor --links`, across the hosts whose doctor ran to its end
# (one that failed its checks still serves as a reference for the links' median), one rank a
# host: every pair of hosts point to point, each host's best pair against the median, and one
# all-reduce. Prints the hosts that pass on stdout, one a line with the training images/s its
# doctor measured when it did (`node01 20.2`: mpirun.sh starts the job's shares of the global
# batch from these), and on stderr one line per host left out with the reason; exits 1 with one
# error line when fewer than MIN_HOSTS pass.
#
#   examples/resnet50/launch/health_gate.sh HOSTFILE
#
#   HOSTFILE  the hosts, one a line: `node01` or `node01 slots=8` (an Open MPI hostfile)
#
# Settings (environment variables; mpirun.sh passes its own):
#   MIN_HOSTS            the fewest hosts that must pass (default 1)
#   HEALTH_DOCTOR_ARGS   spotrain doctor's arguments on each host (default "--model resnet20
#                        --steps 2": every op of the device against the float64 reference, the CPU's
#                        GEMM rate or the GPU's health, a few steps of a small model; 2 s on a
#                        CPU node here). Add --ckpt-dir DIR to check each host's checkpoint
#                        folder (room for --keep checkpoints, write rate) too.
#   HEALTH_TIMEOUT       seconds each host's doctor may take, its start included (default 60):
#                        a host that does not answer in time is left out
#   HEALTH_LINK_ARGS     the link check's arguments (default: none; `spotrain doctor --help`:
#                        --link-min-share 0.5, the share of the median host's rate below which a
#                        host fails; --link-min-gbps, a floor; --link-mb 4, the message size)
#   HEALTH_LINK_TIMEOUT  seconds the link check may take (default 60); a check that does not
#                        finish leaves the hosts in, with a warning
#   HEALTH_PARALLEL      at most this many hosts' doctors at once (default 0: all)
#   HEALTH_LAUNCHER      mpirun (default) or srun: inside a Slurm allocation (slurm.sbatch),
#                        each doctor is one srun task on its node and the link check one srun of
#                        a task per node (SRUN_MPI, default pmix), ranks known by host name
#   SPOTRAIN, MPIRUN, MPIRUN_ARGS, MPI_IFNAME, OOB_KEEPALIVE, EXTRA_ENV: as for mpirun.sh
#   HEALTH_TEST_BREAK_HOST  a test hook, never for real runs: this host's doctor (a hostfile
#                        name) gets a planted wrong op (SPOTRAIN_WRONG_OP=conv2d_forward), so a
#                        test sees a host fail where every host shares one binary and hostname
#
# A slow link is told apart from 3 hosts on: with 2, both hosts' figure is their one pair's,
# and only --link-min-gbps can fail it. The link check runs over MPI on host memory; on GPU
# nodes NCCL's own path (NVLink, InfiniBand with GPUDirect) is not measured.
set -euo pipefail

die() {
  echo "error: health gate: $*" >&2
  exit 2
}
say() { echo "health gate: $*" >&2; }
[[ $# -eq 1 ]] || die "usage: health_gate.sh HOSTFILE"
[[ -r "$1" && ! -d "$1" ]] || die "hostfile '$1' is not a readable file"
mapfile -t hosts < <(grep -vE '^[[:space:]]*(#|$)' "$1" | awk '!seen[$1]++ { print $1 }')
((${#hosts[@]} > 0)) || die "hostfile '$1' lists no hosts"

MIN_HOSTS=${MIN_HOSTS:-1}
[[ "$MIN_HOSTS" =~ ^[1-9][0-9]*$ ]] || die "MIN_HOSTS must be a positive number, got '$MIN_HOSTS'"
HEALTH_TIMEOUT=${HEALTH_TIMEOUT:-60}
[[ "$HEALTH_TIMEOUT" =~ ^[1-9][0-9]*$ ]] || die "HEALTH_TIMEOUT must be a number of seconds, got '$HEALTH_TIMEOUT'"
HEALTH_LINK_TIMEOUT=${HEALTH_LINK_TIMEOUT:-60}
[[ "$HEALTH_LINK_TIMEOUT" =~ ^[1-9][0-9]*$ ]] ||
  die "HEALTH_LINK_TIMEOUT must be a number of seconds, got '$HEALTH_LINK_TIMEOUT'"
read -r -a doctor_args <<<"${HEALTH_DOCTOR_ARGS:---model resnet20 --steps 2}"
read -r -a link_args <<<"${HEALTH_LINK_ARGS:-}"
if [[ -z "${SPOTRAIN:-}" ]]; then
  repo=$(cd "$(dirname "$0")/../../.." && pwd)
  if [[ -x "$repo/build/spotrain" ]]; then SPOTRAIN="$repo/build/spotrain"; else SPOTRAIN=spotrain; fi
fi
HEALTH_PARALLEL=${HEALTH_PARALLEL:-0}
[[ "$HEALTH_PARALLEL" =~ ^[0-9]+$ ]] || die "HEALTH_PARALLEL must be a number of hosts, got '$HEALTH_PARALLEL'"
HEALTH_LAUNCHER=${HEALTH_LAUNCHER:-mpirun}
case $HEALTH_LAUNCHER in
  mpirun)
    MPIRUN=${MPIRUN:-mpirun}
    command -v "$MPIRUN" >/dev/null || die "'$MPIRUN' not found; install Open MPI (Debian: openmpi-bin) or set MPIRUN" ;;
  srun)
    [[ -n "${SLURM_JOB_ID:-}" ]] || die "HEALTH_LAUNCHER=srun runs inside a Slurm allocation (sbatch, salloc)" ;;
  *) die "HEALTH_LAUNCHER must be mpirun or srun, got '$HEALTH_LAUNCHER'" ;;
esac

# mpirun's options, as mpirun.sh gives them: root, the runtime's keepalive (a host that stops
# answering ends the call in seconds), the interface, the forwarded variables, MPIRUN_ARGS.
common=(--bind-to none)
[[ $(id -u) -ne 0 || -n "${OMPI_ALLOW_RUN_AS_ROOT:-}" ]] || common+=(--allow-run-as-root)
read -r ka_time ka_intvl ka_probes <<<"${OOB_KEEPALIVE:-5 2 3}"
common+=(--mca oob_tcp_keepalive_time "$ka_time" --mca oob_tcp_keepalive_intvl "$ka_intvl"
         --mca oob_tcp_keepalive_probes "$ka_probes")
if [[ -n "${MPI_IFNAME:-}" ]]; then
  common+=(--mca btl_tcp_if_include "$MPI_IFNAME" --mca oob_tcp_if_include "$MPI_IFNAME")
fi
for v in NCCL_SOCKET_IFNAME NCCL_IB_HCA NCCL_DEBUG OMP_NUM_THREADS LD_LIBRARY_PATH PATH ${EXTRA_ENV:-}; do
  [[ -n "${!v+set}" ]] && common+=(-x "$v")
done
if [[ -n "${MPIRUN_ARGS:-}" ]]; then
  read -r -a extra <<<"$MPIRUN_ARGS"
  common+=("${extra[@]}")
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# A stop (mpirun.sh passes its SIGTERM on) ends the checks under way: timeout passes it to mpirun.
children=()
trap 'kill ${children[@]+"${children[@]}"} 2>/dev/null || true; exit 143' TERM INT
t0=$(date +%s.%N)
elapsed() { awk -v a="$(date +%s.%N)" -v b="$t0" 'BEGIN { printf "%.1f", a - b }'; }

# 1. The doctor on every host at once (HEALTH_PARALLEL at most), each as one task on its host.
say "checking ${#hosts[@]} host(s): spotrain doctor ${doctor_args[*]} on each (at most ${HEALTH_TIMEOUT} s), then the links between them"
reap() {  # host index: its doctor's exit code, once it ended
  local rc=0
  wait "${children[$1]}" || rc=$?
  echo "$rc" >"$work/rc-$1"
}
for i in "${!hosts[@]}"; do
  h=${hosts[i]}
  ((HEALTH_PARALLEL == 0 || i < HEALTH_PARALLEL)) || reap $((i - HEALTH_PARALLEL))
  hook=()
  [[ "$h" != "${HEALTH_TEST_BREAK_HOST:-}" ]] || hook=(env SPOTRAIN_WRONG_OP=conv2d_forward)
  if [[ $HEALTH_LAUNCHER == srun ]]; then
    launch=(srun --nodes=1 --ntasks=1 --nodelist="$h" --cpus-per-task="${SLURM_CPUS_ON_NODE:-1}" --mpi=none)
  else
    launch=("$MPIRUN" --host "$h" -np 1 "${common[@]}" ${hook[@]+-x SPOTRAIN_WRONG_OP})
  fi
  ${hook[@]+"${hook[@]}"} timeout -k 5 "$HEALTH_TIMEOUT" "${launch[@]}" \
    "$SPOTRAIN" doctor "${doctor_args[@]}" >"$work/doctor-$i" 2>&1 </dev/null &
  children+=($!)
done
for i in "${!hosts[@]}"; do
  [[ -e "$work/rc-$i" ]] || reap "$i"
done

doctor_s=$(elapsed)
declare -A reason=()  # host -> why it is left out
declare -A rate=()    # host -> the training images/s its doctor measured
linked=()             # hosts whose doctor ran to its end: the link check's ranks
for i in "${!hosts[@]}"; do
  h=${hosts[i]} rc=$(cat "$work/rc-$i") out="$work/doctor-$i"
  summary=$(grep -m1 '^doctor: ' "$out" || true)
  if ((rc == 0)); then
    say "$h: ${summary#doctor: }"
    linked+=("$h")
    r=$(sed -nE 's/^(ok|warn) +steps .* speed: ([0-9.]+) images\/s.*/\2/p' "$out" | head -n 1)
    [[ -z "$r" ]] || rate[$h]=$r
  elif [[ "$summary" == "doctor: NOT healthy"* ]]; then
    first=$(grep -m1 -E '^fail ' "$out" | tr -s ' ' || true)
    reason[$h]="doctor: ${first:-$summary}"
    linked+=("$h")
  elif ((rc == 124 || rc == 137)); then
    reason[$h]="doctor did not finish within HEALTH_TIMEOUT=${HEALTH_TIMEOUT} s (a host that does not answer, or a hung check)"
  else
    last=$(grep -m1 'error:' "$out" || grep -v '^[[:space:]]*$' "$out" | tail -n 1 || true)
    reason[$h]="doctor could not run (exit $rc): ${last:-no output}"
  fi
done

# 2. The links, one rank a host. mpirun: each rank on its host by name (an app context per
# host, so rank i is linked[i] whatever order the runtime keeps its nodes in). srun: Slurm
# orders the ranks itself, so each rank is known by its host name (a node's short name).
if ((${#linked[@]} >= 2)); then
  names=$(IFS=,; echo "${linked[*]}")
  if [[ $HEALTH_LAUNCHER == srun ]]; then
    launch=(srun --nodes=${#linked[@]} --ntasks=${#linked[@]} --ntasks-per-node=1 --nodelist="$names"
            --mpi="${SRUN_MPI:-pmix}" "$SPOTRAIN" doctor --links ${link_args[@]+"${link_args[@]}"})
  else
    launch=("$MPIRUN" "${common[@]}")
    sep=()
    for h in "${linked[@]}"; do
      launch+=(${sep[@]+"${sep[@]}"} --host "$h" -np 1 "$SPOTRAIN" doctor --links --names "$names"
               ${link_args[@]+"${link_args[@]}"})
      sep=(:)
    done
  fi
  timeout -k 5 "$HEALTH_LINK_TIMEOUT" "${launch[@]}" >"$work/links" 2>&1 </dev/null &
  children=($!)
  rc=0
  wait "${children[0]}" || rc=$?
  for h in "${linked[@]}"; do
    line=$(awk -v h="$h" 'function short(s) { sub(/:$/, "", s); return s ~ /^[0-9.]+$/ ? s : substr(s, 1, index(s ".", ".") - 1) }
                          ($1 == "ok" || $1 == "warn" || $1 == "fail") && $2 == "link" && short($3) == short(h)' "$work/links" | head -n 1)
    if [[ -z "$line" ]]; then
      say "warning: $h: the link check gave no figure (exit $rc: $(grep -m1 'error:' "$work/links" || tail -n 1 "$work/links")); kept without a link verdict"
      continue
    fi
    verdict=${line%% *} what=$(sed -E 's/^[a-z]+ +link [^ ]+: //' <<<"$line")
    if [[ "$verdict" == fail ]]; then
      reason[$h]="${reason[$h]:+${reason[$h]}; }link: $what"
    elif [[ -z "${reason[$h]:-}" ]]; then
      say "$h: link $what"
    fi
  done
  ar=$(grep -m1 -E '^[a-z]+ +allreduce ' "$work/links" | tr -s ' ' | cut -d' ' -f2- || true)
  [[ -z "$ar" ]] || say "$ar"
elif ((${#linked[@]} == 1)); then
  say "links: not measured (one host left to measure)"
fi

kept=()
for h in "${hosts[@]}"; do
  if [[ -n "${reason[$h]:-}" ]]; then say "left out $h: ${reason[$h]}"; else kept+=("$h"); fi
done
if ((${#kept[@]} < MIN_HOSTS)); then
  echo "error: health gate: ${#kept[@]} of ${#hosts[@]} host(s) passed in $(elapsed) s, fewer than MIN_HOSTS=$MIN_HOSTS; not starting" >&2
  exit 1
fi
say "${#kept[@]} of ${#hosts[@]} host(s) passed in $(elapsed) s (the doctors ${doctor_s} s)${kept[*]:+: ${kept[*]}}"
for h in ${kept[@]+"${kept[@]}"}; do echo "$h${rate[$h]:+ ${rate[$h]}}"; done
