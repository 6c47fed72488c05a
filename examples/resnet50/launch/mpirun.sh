#!/usr/bin/env bash
# Multi-node launch of `spotrain train` with Open MPI and a hostfile: one process (rank) per
# GPU, or per CPU share of a node, on every host listed. Prints the mpirun command it runs.
#
#   examples/resnet50/launch/mpirun.sh HOSTFILE NP [spotrain train arguments...]
#
#   HOSTFILE  Open MPI hostfile, one node a line: `node01 slots=8` (see hosts.example); `-`
#             with HOST_DISCOVERY
#   NP        total number of ranks (at most nodes x RANKS_PER_NODE); with HOST_DISCOVERY the
#             most ranks: each start takes min(NP, hosts up x RANKS_PER_NODE)
#
# Settings (environment variables):
#   RANKS_PER_NODE    ranks started on each node (default 1). GPU ranks: the GPUs per node.
#                     CPU ranks: 1, or the number of sockets.
#   THREADS_PER_RANK  compute threads of each rank; sets OMP_NUM_THREADS and passes
#                     --threads (spotrain's --threads 0 means every core of the node, so set
#                     this whenever RANKS_PER_NODE > 1)
#   BIND_TO           none (default) or core: core pins each rank to THREADS_PER_RANK cores
#                     of its own (--map-by ppr:R:node:PE=T --bind-to core), good for CPU ranks
#   MPI_IFNAME        network interface(s) Open MPI itself should use, e.g. eth0 or
#                     10.0.0.0/16 (sets btl_tcp_if_include and oob_tcp_if_include)
#   SPOTRAIN          the spotrain binary, same path on every node (default: this checkout's
#                     build/spotrain if it exists, else `spotrain` on PATH)
#   MPIRUN            the mpirun to use (default: mpirun)
#   MPIRUN_ARGS       extra mpirun arguments, split on spaces (e.g. "--mca btl ^openib")
#   EXTRA_ENV         names of extra environment variables to forward, split on spaces
#   DRY_RUN=1         print the command and stop
#   HOST_DISCOVERY    a command that prints the hosts that are up, one a line (`node01`, or
#                     `node01 slots=8`: the slots are RANKS_PER_NODE's), as Horovod's
#                     --host-discovery-script. Each start and restart runs on the hosts it lists
#                     then: a restart after a lost host needs no replacement, it goes on at once
#                     on the hosts that remain (no RESTART_DELAY). It should list only hosts that
#                     answer; a start that cannot reach one it listed (mpirun's 255) counts as a
#                     lost peer (76) and restarts, and so does one whose daemon there cannot
#                     connect back (a host listed before its network is up), after
#                     RESTART_DELAY. The job's global batch (ranks x --batch-size x
#                     --accum-steps at its first start) is kept on every rank count it gets:
#                     pass the same arguments every time and spotrain splits it on resume:
#                     global / ranks images per rank, as one micro-batch where that is at most
#                     --batch-size, else as the fewest equal micro-batches of at most
#                     --batch-size and at least half of it (4 ranks x B shrunk to 2: 2 x B x 2,
#                     the same memory per GPU). A rank count with no such split is refused,
#                     naming those that work; this script warns at the start when one it may
#                     get (a multiple of RANKS_PER_NODE up to NP) would be (`spotrain batch`).
#   MIN_HOSTS         with HOST_DISCOVERY: fewer hosts up than this (default 1) and the script
#                     waits, asking again after RESTART_DELAY, doubled up to RESTART_DELAY_MAX,
#                     for at most HOST_WAIT_MAX seconds (default 3600; then it exits 76)
#   DISCOVERY_INTERVAL  with HOST_DISCOVERY: seconds between the questions while the job runs
#                     (default 60; 0 = never). When the command lists more hosts than the job
#                     runs on, the job is stopped at an agreed step with a checkpoint (as by
#                     SIGUSR1) and started again on all of them: it grows back. Such a restart
#                     does not count against MAX_RESTARTS.
#   LEAVE_FOR         with HOST_DISCOVERY and `--straggler-action leave`: when the job stops
#                     to leave a straggling host behind (rank 0's record `spotrain-record
#                     {"type":"leave","host":"H",...}`), it starts again at once on the other hosts up, and H is left
#                     out of the discovered hosts for this many seconds (default 3600) before it
#                     may rejoin (the job then grows onto it as onto any host that comes up).
#                     Such a restart does not count against MAX_RESTARTS.
#   MAX_RESTARTS      restart the job up to this many times (default 0) when it ends resumably:
#                     75 (stopped with a checkpoint by spotrain itself, e.g. --max-wall-time or
#                     a signal to a rank) or 76 (a peer was lost: a rank or node died, a link
#                     broke); each restart adds --resume auto, or --resume latest once the job
#                     has shown a checkpoint exists (a restart then refuses to start over
#                     when no disk holds one any more). Not after a stop signal to this
#                     script, not after a success or any other error.
#   RESTART_DELAY     seconds before the first restart (default 10), doubled each time up to
#                     RESTART_DELAY_MAX (default 300)
#   OOB_KEEPALIVE     "TIME INTERVAL PROBES" of Open MPI's runtime connections (default
#                     "5 2 3"): a node that stops answering (a cut link, a powered-off host)
#                     ends the job about TIME + INTERVAL x PROBES seconds later, on every node,
#                     instead of Open MPI 4.1's default 300 + 20 x 9 s, during which mpirun
#                     and the lost node's daemon wait on each other. Such an end exits 76.
#                     A rank whose --comm-timeout fires first leaves the runtime that long
#                     (+ 2 s) before it aborts (docs/MULTI_NODE.md, "When a node is lost").
#   HEALTH_CHECK=1    before each start and restart, the health gate (health_gate.sh, whose
#                     header lists its settings: HEALTH_DOCTOR_ARGS, HEALTH_TIMEOUT,
#                     HEALTH_LINK_ARGS, HEALTH_LINK_TIMEOUT) on the hosts of that start:
#                     `spotrain doctor` on each, then the links between them (each host's
#                     best pair against the median). The start takes the hosts that pass, each
#                     left out named with the reason (NP at most their ranks; at a first start
#                     that sets the job's global batch); fewer than MIN_HOSTS (default 1) pass:
#                     exit 1. With HOST_DISCOVERY a host left out is not asked again for
#                     LEAVE_FOR seconds. The training rate each host's doctor measured seeds the
#                     job's first shares of the global batch (the default --straggler-action
#                     rebalance). 13-17 s for 3 CPU hosts here; not with DRY_RUN.
#   SURVIVOR_WAIT     once a rank has died, Open MPI signals the others SIGCONT, then SIGTERM,
#                     then SIGKILL, this many seconds apart (odls_base_sigkill_timeout; default
#                     5, Open MPI's own 1), and mpirun returns after the last. Between the
#                     first and the last the survivors save the last step every rank finished
#                     (they notice 1 s after the SIGCONT; the save takes about a checkpoint's
#                     write): keep 2 x SURVIVOR_WAIT above that.
#
# SIGTERM, SIGINT or SIGUSR1 to this script stops the job resumably: the ranks finish the step,
# write and verify a checkpoint, and the script exits 75 (resume with --resume auto). Allow
# the time the run logs as "a stop takes about N s" between the signal and any kill.
#
# Forwarded to every rank when set here: NCCL_SOCKET_IFNAME NCCL_IB_HCA NCCL_DEBUG
# OMP_NUM_THREADS LD_LIBRARY_PATH PATH SPOTRAIN_FAULT and EXTRA_ENV.
#
# Example (2 nodes, one CPU rank of 32 threads each):
#   THREADS_PER_RANK=32 examples/resnet50/launch/mpirun.sh hosts 2 \
#     --model resnet20 --data fashion-mnist --epochs 6 --batch-size 128 --ckpt-dir /shared/ckpt
# 8 GPUs per node, 16 GPUs:
#   RANKS_PER_NODE=8 examples/resnet50/launch/mpirun.sh hosts 16 --device cuda ...
# See docs/MULTI_NODE.md.
set -euo pipefail

die() {
  echo "error: $*" >&2
  exit 2
}
usage() {
  sed -n '5,9p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

[[ $# -ge 1 && ( "$1" == "-h" || "$1" == "--help" ) ]] && usage
[[ $# -ge 2 ]] || { echo "error: HOSTFILE and NP are required" >&2; usage; }
HOSTFILE=$1
NP=$2
shift 2

HOST_DISCOVERY=${HOST_DISCOVERY:-}
if [[ -z "$HOST_DISCOVERY" ]]; then
  [[ -e "$HOSTFILE" ]] || die "hostfile '$HOSTFILE' does not exist; write one line per node, e.g. 'node01 slots=8' (see examples/resnet50/launch/hosts.example)"
  [[ -f "$HOSTFILE" && -r "$HOSTFILE" ]] || die "hostfile '$HOSTFILE' is not a readable file"
fi
[[ "$NP" =~ ^[1-9][0-9]*$ ]] || die "NP must be a positive number of ranks, got '$NP'"

RANKS_PER_NODE=${RANKS_PER_NODE:-1}
[[ "$RANKS_PER_NODE" =~ ^[1-9][0-9]*$ ]] || die "RANKS_PER_NODE must be a positive number, got '$RANKS_PER_NODE'"
THREADS_PER_RANK=${THREADS_PER_RANK:-}
[[ -z "$THREADS_PER_RANK" || "$THREADS_PER_RANK" =~ ^[1-9][0-9]*$ ]] ||
  die "THREADS_PER_RANK must be a positive number, got '$THREADS_PER_RANK'"
BIND_TO=${BIND_TO:-none}
[[ "$BIND_TO" == none || "$BIND_TO" == core ]] || die "BIND_TO must be none or core, got '$BIND_TO'"
[[ "$BIND_TO" == none || -n "$THREADS_PER_RANK" ]] || die "BIND_TO=core needs THREADS_PER_RANK (cores per rank)"

MIN_HOSTS=${MIN_HOSTS:-1}
[[ "$MIN_HOSTS" =~ ^[1-9][0-9]*$ ]] || die "MIN_HOSTS must be a positive number, got '$MIN_HOSTS'"
HOST_WAIT_MAX=${HOST_WAIT_MAX:-3600}
[[ "$HOST_WAIT_MAX" =~ ^[0-9]+$ ]] || die "HOST_WAIT_MAX must be a number of seconds, got '$HOST_WAIT_MAX'"
DISCOVERY_INTERVAL=${DISCOVERY_INTERVAL:-60}
[[ "$DISCOVERY_INTERVAL" =~ ^[0-9]+$ ]] || die "DISCOVERY_INTERVAL must be a number of seconds, got '$DISCOVERY_INTERVAL'"

# The hosts HOST_DISCOVERY lists now, one name a line (its slots are RANKS_PER_NODE's), less
# those left out (stragglers left behind, hosts the health gate failed) until their LEAVE_FOR
# has passed.
discover() {
  local out now
  out=$(bash -c "$HOST_DISCOVERY" 2>/dev/null) || return 1
  now=$(date +%s)
  grep -vE '^[[:space:]]*(#|$)' <<<"$out" | awk '{print $1}' | sort -u |
    awk -v now="$now" -v left="$left_out" '
      BEGIN { while ((getline l < left) > 0) { split(l, f, " "); if (f[2] > now) out[f[1]] = 1 } }
      !($1 in out)'
}
state_dir=$(mktemp -d)  # the discovered hostfile, the job's output pipes, what it showed
trap 'rm -rf "$state_dir"' EXIT
left_out="$state_dir/left-out"  # "HOST UNTIL" lines: hosts left out until then
: >"$left_out"
LEAVE_FOR=${LEAVE_FOR:-3600}
[[ "$LEAVE_FOR" =~ ^[0-9]+$ ]] || die "LEAVE_FOR must be a number of seconds, got '$LEAVE_FOR'"
if [[ -n "$HOST_DISCOVERY" ]]; then
  HOSTFILE="$state_dir/hosts"
  discover >/dev/null || die "HOST_DISCOVERY '$HOST_DISCOVERY' failed; it must print the hosts that are up, one a line"
  NODES=0
else
  # Nodes in the hostfile: lines that are not blank or comments.
  NODES=$(grep -cvE '^[[:space:]]*(#|$)' "$HOSTFILE" || true)
  ((NODES > 0)) || die "hostfile '$HOSTFILE' lists no nodes"
  ((NP <= NODES * RANKS_PER_NODE)) ||
    die "NP=$NP ranks do not fit on $NODES node(s) x RANKS_PER_NODE=$RANKS_PER_NODE; add nodes or raise RANKS_PER_NODE"
fi

if [[ -z "${SPOTRAIN:-}" ]]; then
  repo=$(cd "$(dirname "$0")/../../.." && pwd)
  if [[ -x "$repo/build/spotrain" ]]; then SPOTRAIN="$repo/build/spotrain"; else SPOTRAIN=spotrain; fi
fi
MPIRUN=${MPIRUN:-mpirun}
command -v "$MPIRUN" >/dev/null || die "'$MPIRUN' not found; install Open MPI (Debian: openmpi-bin) or set MPIRUN"

# spotrain train arguments: pass --threads unless the caller did.
args=("$@")
user_threads=0
for a in "${args[@]}"; do
  [[ "$a" == --threads || "$a" == --threads=* ]] && user_threads=1
done
if [[ -n "$THREADS_PER_RANK" ]]; then
  export OMP_NUM_THREADS="$THREADS_PER_RANK"
  ((user_threads)) || args+=(--threads "$THREADS_PER_RANK")
elif ((RANKS_PER_NODE > 1 && !user_threads)); then
  echo "warning: RANKS_PER_NODE=$RANKS_PER_NODE but no THREADS_PER_RANK or --threads: each rank" \
       "will start one compute thread per core of its node (oversubscribed on CPU ranks)" >&2
fi

cmd=()  # mpirun's own options; the hostfile and the rank count come first, per start
if [[ "$BIND_TO" == core ]]; then
  cmd+=(--map-by "ppr:${RANKS_PER_NODE}:node:PE=${THREADS_PER_RANK}" --bind-to core)
else
  cmd+=(--map-by "ppr:${RANKS_PER_NODE}:node" --bind-to none)
fi
if [[ $(id -u) -eq 0 && -z "${OMPI_ALLOW_RUN_AS_ROOT:-}" ]]; then
  cmd+=(--allow-run-as-root)  # Open MPI refuses root otherwise
fi
read -r ka_time ka_intvl ka_probes <<<"${OOB_KEEPALIVE:-5 2 3}"
[[ "$ka_time" =~ ^[0-9]+$ && "$ka_intvl" =~ ^[0-9]+$ && "$ka_probes" =~ ^[0-9]+$ ]] ||
  die "OOB_KEEPALIVE must be three numbers (TIME INTERVAL PROBES), got '${OOB_KEEPALIVE:-}'"
cmd+=(--mca oob_tcp_keepalive_time "$ka_time" --mca oob_tcp_keepalive_intvl "$ka_intvl"
      --mca oob_tcp_keepalive_probes "$ka_probes")
SURVIVOR_WAIT=${SURVIVOR_WAIT:-5}
[[ "$SURVIVOR_WAIT" =~ ^[0-9]+$ ]] || die "SURVIVOR_WAIT must be a number of seconds, got '$SURVIVOR_WAIT'"
cmd+=(--mca odls_base_sigkill_timeout "$SURVIVOR_WAIT")
if [[ -n "${MPI_IFNAME:-}" ]]; then
  cmd+=(--mca btl_tcp_if_include "$MPI_IFNAME" --mca oob_tcp_if_include "$MPI_IFNAME")
fi
export SPOTRAIN_STOP_EXIT_CODE=0  # a finished stop exits 0: see "Preemption" below
# The hosts of each start, by the names this script knows them by: each rank names its own
# host so in its straggler lines (set per start by launch_cmd).
export SPOTRAIN_HOSTS=
export SPOTRAIN_HOST_RATES=  # with HEALTH_CHECK=1: each host's rate, from the gate (health_gate)
if [[ -n "$HOST_DISCOVERY" ]]; then
  # --straggler-action leave may stop the job to leave a host behind: this script restarts it.
  export SPOTRAIN_LEAVE_HOSTS=1 SPOTRAIN_MIN_HOSTS=$MIN_HOSTS
fi
for v in NCCL_SOCKET_IFNAME NCCL_IB_HCA NCCL_DEBUG OMP_NUM_THREADS LD_LIBRARY_PATH PATH \
         SPOTRAIN_FAULT SPOTRAIN_STOP_EXIT_CODE SPOTRAIN_HOSTS SPOTRAIN_HOST_RATES SPOTRAIN_LEAVE_HOSTS SPOTRAIN_MIN_HOSTS \
         ${EXTRA_ENV:-}; do
  [[ -n "${!v+set}" ]] && cmd+=(-x "$v")
done
if [[ -n "${MPIRUN_ARGS:-}" ]]; then
  read -r -a extra <<<"$MPIRUN_ARGS"
  cmd+=("${extra[@]}")
fi
cmd+=("$SPOTRAIN" train ${args[@]+"${args[@]}"})

# With HOST_DISCOVERY: the hostfile of the hosts up now and the ranks they take (waiting, with
# a bounded back-off, while fewer than MIN_HOSTS are up). Sets HOSTS_NOW and NP_NOW.
HOSTS_NOW=$NODES
NP_NOW=$NP
pick_hosts() {
  [[ -n "$HOST_DISCOVERY" ]] || return 0
  local waited=0 wait_s=${RESTART_DELAY:-10} hosts n
  ((wait_s > 0)) || wait_s=1
  while :; do
    hosts=$(discover || true)
    n=$(grep -c . <<<"$hosts" || true)
    ((n >= MIN_HOSTS)) && break
    if ((waited >= HOST_WAIT_MAX)); then
      echo "mpirun.sh: $n host(s) up after ${waited} s, fewer than MIN_HOSTS=$MIN_HOSTS; giving up" >&2
      exit 76
    fi
    echo "mpirun.sh: $n host(s) up, fewer than MIN_HOSTS=$MIN_HOSTS; asking again in ${wait_s} s" >&2
    sleep "$wait_s" &
    wait $! || true
    ((stop_asked == 0)) || exit 75
    waited=$((waited + wait_s))
    wait_s=$((wait_s * 2 > ${RESTART_DELAY_MAX:-300} ? ${RESTART_DELAY_MAX:-300} : wait_s * 2))
  done
  awk -v s="$RANKS_PER_NODE" '{print $1 " slots=" s}' <<<"$hosts" >"$HOSTFILE"
  HOSTS_NOW=$n
  NP_NOW=$((n * RANKS_PER_NODE < NP ? n * RANKS_PER_NODE : NP))
}
launch_cmd() {
  full=("$MPIRUN" --hostfile "$HOSTFILE" -np "$NP_NOW" "${cmd[@]}")
  SPOTRAIN_HOSTS=$(grep -vE '^[[:space:]]*(#|$)' "$HOSTFILE" | awk '{printf "%s%s", sep, $1; sep = " "}')
}

# With HEALTH_CHECK=1, before each start: health_gate.sh on the hosts of this start (the given
# hostfile whole, or those HOST_DISCOVERY listed); the start takes those that passed (NP_NOW at
# most their ranks). Fewer than MIN_HOSTS passed: exit 1 after the gate's error line.
health_gate() {
  [[ "${HEALTH_CHECK:-0}" == 1 ]] || return 0
  if [[ -z "$HOST_DISCOVERY" ]]; then
    gate_src=${gate_src:-$HOSTFILE}
    HOSTFILE="$state_dir/hosts-healthy"
  fi
  local src=${gate_src:-$HOSTFILE} rc pid
  SPOTRAIN="$SPOTRAIN" MPIRUN="$MPIRUN" MIN_HOSTS="$MIN_HOSTS" \
    "$(dirname "$0")/health_gate.sh" "$src" >"$state_dir/passed" &
  pid=$!
  while :; do  # (a trapped stop signal ends the wait, not the gate: it is passed on)
    rc=0
    wait "$pid" || rc=$?
    kill -0 "$pid" 2>/dev/null || break
    ((stop_asked == 0)) || kill "$pid" 2>/dev/null || true
  done
  ((stop_asked == 0)) || exit 75
  ((rc == 0)) || exit 1
  awk 'NR == FNR { keep[$1] = 1; next } !/^[[:space:]]*(#|$)/ && keep[$1]' "$state_dir/passed" "$src" \
    >"$state_dir/hosts-kept"
  if [[ -n "$HOST_DISCOVERY" ]]; then
    # Not asked again for LEAVE_FOR s, as a straggler left behind: else the job would grow onto
    # a host that just failed as soon as the poller saw it listed.
    awk -v till=$(($(date +%s) + LEAVE_FOR)) 'NR == FNR { keep[$1] = 1; next } !keep[$1] { print $1, till }' \
      "$state_dir/passed" "$src" >>"$left_out"
  fi
  mv "$state_dir/hosts-kept" "$HOSTFILE"
  # Each host's training rate as its doctor measured it: the job's first shares of the global
  # batch follow them (SPOTRAIN_HOST_RATES).
  SPOTRAIN_HOST_RATES=$(awk 'NF >= 2 { printf "%s%s=%s", sep, $1, $2; sep = " " }' "$state_dir/passed")
  HOSTS_NOW=$(grep -c . "$state_dir/passed")
  NP_NOW=$((HOSTS_NOW * RANKS_PER_NODE < NP ? HOSTS_NOW * RANKS_PER_NODE : NP))
}

# With HOST_DISCOVERY: warn now of the rank counts the job may shrink or grow to on which
# spotrain would refuse to resume, as `spotrain batch` answers (run/global_batch.h, the rule a
# resume follows). Settings given in a --config file are not read here.
if [[ -n "$HOST_DISCOVERY" ]]; then
  batch=128 accum=1 read_all=1
  for ((i = 0; i < ${#args[@]}; i++)); do
    case ${args[i]} in
      --batch-size) batch=${args[i + 1]:-} ;;
      --batch-size=*) batch=${args[i]#*=} ;;
      --accum-steps) accum=${args[i + 1]:-} ;;
      --accum-steps=*) accum=${args[i]#*=} ;;
      --config | --config=*) read_all=0 ;;
    esac
  done
  if ((read_all)) && [[ "$batch" =~ ^[1-9][0-9]*$ && "$accum" =~ ^[1-9][0-9]*$ ]]; then
    global=$((NP * batch * accum))
    counts=()
    for ((n = MIN_HOSTS; (n - 1) * RANKS_PER_NODE < NP; n++)); do
      counts+=($((n * RANKS_PER_NODE < NP ? n * RANKS_PER_NODE : NP)))
    done
    list=$(IFS=,; echo "${counts[*]}")
    # (a spotrain that cannot run here, on the launcher's machine, is asked nothing)
    refused=$("$SPOTRAIN" batch --global-batch "$global" --batch-size "$batch" --ranks "$list" --refused 2>/dev/null) ||
      refused=
    [[ -z "$refused" ]] ||
      echo "mpirun.sh: warning: the global batch of $global ($NP ranks x --batch-size $batch x" \
           "--accum-steps $accum) does not split over $refused rank(s) (ranks x --batch-size x" \
           "micro-batches per step; \`spotrain batch\` says why): spotrain would refuse to resume on so many;" \
           "pick NP, RANKS_PER_NODE and --batch-size so that it does" >&2
  fi
fi

stop_asked=0
if [[ "${DRY_RUN:-0}" == 1 ]]; then
  pick_hosts
  launch_cmd
  printf 'mpirun.sh: %d rank(s) on %d node(s) from %s\n+' "$NP_NOW" "$HOSTS_NOW" "${HOST_DISCOVERY:-$HOSTFILE}"
  printf ' %q' "${full[@]}"
  printf '\n'
  exit 0
fi

# Preemption. A scheduler's stop (scancel, a pod deletion, Ctrl-C) signals this script, the
# launcher. Open MPI's mpirun meets SIGTERM or SIGINT by killing the ranks (SIGKILL about a
# second after its own SIGTERM, odls_base_sigkill_timeout), which loses the stop checkpoint;
# SIGUSR1 it forwards to every rank at once and leaves them be. So mpirun runs as a child here
# and TERM, INT and USR1 all reach it as SIGUSR1: every rank finishes its step, rank 0 writes
# and verifies the stop checkpoint, all exit, and this script exits 75.
#
# The ranks of a finished stop exit 0 here (SPOTRAIN_STOP_EXIT_CODE), not 75, and this script
# takes the stop from rank 0's line "stopped by ... after step N; resume with --resume auto":
# Open MPI meets any non-zero exit with its kill sequence (SIGCONT, SIGTERM, SIGKILL,
# SURVIVOR_WAIT apart), which would hold mpirun for 2 x SURVIVOR_WAIT after every rank had
# already ended. Started without this script, the ranks exit 75.
MAX_RESTARTS=${MAX_RESTARTS:-0}
[[ "$MAX_RESTARTS" =~ ^[0-9]+$ ]] || die "MAX_RESTARTS must be a number, got '$MAX_RESTARTS'"
delay=${RESTART_DELAY:-10}
[[ "$delay" =~ ^[0-9]+$ ]] || die "RESTART_DELAY must be a number of seconds, got '$delay'"
delay_max=${RESTART_DELAY_MAX:-300}
[[ "$delay_max" =~ ^[0-9]+$ ]] || die "RESTART_DELAY_MAX must be a number of seconds, got '$delay_max'"
mpirun_pid=
poller_pid=
forward_stop() {
  stop_asked=1
  signalled=1
  [[ -n "$mpirun_pid" ]] && kill -USR1 "$mpirun_pid" 2>/dev/null || true
}
# A poller's word that more hosts are up than the job runs on: the agreed stop, then a start
# on all of them.
grow=0
grow_now() {
  signalled=1
  grow=1
  [[ -n "$mpirun_pid" ]] && kill -USR1 "$mpirun_pid" 2>/dev/null || true
}
trap forward_stop TERM INT USR1
trap grow_now USR2
start_poller() {
  [[ -n "$HOST_DISCOVERY" && "$DISCOVERY_INTERVAL" -gt 0 ]] || return 0
  local me=$$ now=$HOSTS_NOW ranks=$NP_NOW
  (
    trap - TERM INT USR1 USR2
    while sleep "$DISCOVERY_INTERVAL"; do
      n=$( (discover || true) | grep -c . || true)
      # Grow only when the hosts up would take more ranks (NP caps them).
      more=$((n * RANKS_PER_NODE < NP ? n * RANKS_PER_NODE : NP))
      if ((more > ranks)); then
        echo "mpirun.sh: $n hosts are up, the job runs on $now: growing it to $more rank(s) at an agreed step" >&2
        kill -USR2 "$me"
        exit 0
      fi
    done
  ) &
  poller_pid=$!
}
stop_poller() {
  [[ -n "$poller_pid" ]] && kill "$poller_pid" 2>/dev/null || true
  poller_pid=
}
# The job's output passes through here, each stream as it was, to note whether it showed that a
# checkpoint of the run exists (written, saved by a survivor, resumed from). Once one has, the
# restarts pass --resume latest, which refuses to start over when no rank's disk holds one any
# more (node-local disks all replaced) instead of training again from scratch.
seen_ckpt="$state_dir/seen-checkpoint"
# This attempt's rank 0 said it stopped with a checkpoint (its ranks then exit 0: above).
stopped_mark="$state_dir/stopped"
# The host this attempt stopped to leave behind (--straggler-action leave).
leave_mark="$state_dir/leave"
# The first error line any attempt printed: what the last line says when the restarts run out.
first_error="$state_dir/first-error"
# This attempt's mpirun could not start its daemon on every host (Open MPI 4's "ORTE was unable
# to reliably start one or more daemons", PRRTE's "PRTE was ..."; mpirun then exits 1).
start_failed="$state_dir/start-failed"
watch_output() {
  trap '' TERM INT USR1 USR2  # forward to the end: the job's last lines say what it saved
  local line
  while IFS= read -r line || [[ -n "$line" ]]; do
    printf '%s\n' "$line"
    case $line in
      *"checkpoint written: "* | *"saved the last step every rank finished"* | *"resumed from "*)
        [[ -e "$seen_ckpt" ]] || : >"$seen_ckpt" ;;
      *"stopped by "*" after step "*"; resume with --resume auto")
        : >"$stopped_mark" ;;
      "spotrain-record "*'"type":"leave"'*)
        # rank 0's record of a decision to leave a straggling host behind (MetricsSink::announce)
        [[ $line =~ \"host\":\"([^\"]*)\" ]] && printf '%s\n' "${BASH_REMATCH[1]}" >"$leave_mark" ;;
      *"was unable to reliably start one or more daemons"*)
        : >"$start_failed" ;;
      *"error: "*)
        [[ -s "$first_error" ]] || printf '%s\n' "${line#*error: }" >"$first_error" ;;
    esac
  done
}
mkfifo "$state_dir/out" "$state_dir/err"
restarts=0
while :; do
  pick_hosts
  health_gate
  launch_cmd
  printf 'mpirun.sh: %d rank(s) on %d node(s) from %s\n+' "$NP_NOW" "$HOSTS_NOW" "${HOST_DISCOVERY:-$HOSTFILE}"
  printf ' %q' "${full[@]}"
  printf '\n'
  rm -f "$stopped_mark" "$start_failed" "$leave_mark"
  watch_output <"$state_dir/out" &
  watch_out=$!
  watch_output <"$state_dir/err" >&2 &
  watch_err=$!
  "${full[@]}" >"$state_dir/out" 2>"$state_dir/err" &
  mpirun_pid=$!
  ((stop_asked)) && kill -USR1 "$mpirun_pid" 2>/dev/null  # a stop that came while starting
  start_poller
  while :; do
    signalled=0
    rc=0
    wait "$mpirun_pid" || rc=$?
    ((signalled)) || break  # a trapped signal cut the wait short: mpirun still runs
  done
  mpirun_pid=
  stop_poller
  # The job's last lines, once whatever else held its output let go (2 s at most).
  for _ in $(seq 20); do
    kill -0 "$watch_out" 2>/dev/null || kill -0 "$watch_err" 2>/dev/null || break
    sleep 0.1
  done
  # Open MPI's "lost communication with a remote daemon" (205): a node is gone; a rank killed
  # without notice (137: SIGKILL, a reclaimed instance): both a lost peer, as 76. With
  # HOST_DISCOVERY so is a start that could not reach a host it listed (255, ssh's failure:
  # the host left after the question, a worker pod stopping as the job restarts; the restart
  # asks again at once), and one whose daemon there could not connect back (1, with Open MPI's
  # "unable to reliably start one or more daemons": a host listed before its network is up,
  # an instance just started; the restart asks again after RESTART_DELAY).
  ((rc == 0)) && [[ -e "$stopped_mark" ]] && rc=75  # a finished stop (SPOTRAIN_STOP_EXIT_CODE)
  ((rc == 205 || rc == 137)) && rc=76
  unreached=0
  if [[ -n "$HOST_DISCOVERY" ]]; then
    ((rc == 255)) && rc=76
    if ((rc != 0 && rc != 75 && rc != 76)) && [[ -e "$start_failed" ]]; then
      rc=76
      unreached=1
    fi
  fi
  if ((rc == 75 && stop_asked == 0)) && [[ -n "$HOST_DISCOVERY" && -s "$leave_mark" ]]; then
    # Stopped to leave a straggler behind: at once, on the other hosts, not counted as a restart.
    grow=0
    what="without a straggler"
    h=$(head -n 1 "$leave_mark")
    echo "$h $(($(date +%s) + LEAVE_FOR))" >>"$left_out"
    echo "mpirun.sh: the job stopped to leave host $h behind (a straggler); it is left out for ${LEAVE_FOR} s (LEAVE_FOR); starting again on the other hosts up now" >&2
  elif ((grow && rc == 75 && stop_asked == 0)); then
    # Stopped to grow: at once, on the hosts up now, not counted as a restart.
    grow=0
    what="to grow"
    echo "mpirun.sh: the job stopped to grow; starting it again on the hosts up now" >&2
  else
    what=$((restarts + 1))
    grow=0
    # Restart only what a restart can mend, and never what this script was asked to stop.
    ((stop_asked == 0 && (rc == 75 || rc == 76) && restarts < MAX_RESTARTS)) || break
    restarts=$((restarts + 1))
    if [[ -n "$HOST_DISCOVERY" ]] && ((unreached == 0)); then
      # On the hosts that remain, at once (pick_hosts waits while too few are up).
      echo "mpirun.sh: the job ended with $rc; restart $restarts of $MAX_RESTARTS on the hosts up now" >&2
    else
      # After RESTART_DELAY: without HOST_DISCOVERY, and for a host listed before it could be
      # reached (asked again at once, it would likely fail again).
      if ((unreached)); then
        echo "mpirun.sh: the job could not start on every host listed ($rc); restart $restarts of $MAX_RESTARTS on the hosts up in ${delay} s" >&2
      else
        echo "mpirun.sh: the job ended with $rc; restart $restarts of $MAX_RESTARTS in ${delay} s" >&2
      fi
      sleep "$delay" &
      wait $! || true
      ((stop_asked == 0)) || break
      delay=$((delay * 2 > delay_max ? delay_max : delay * 2))
    fi
  fi
  # The same command, resuming: any --resume given is replaced by --resume auto (latest once
  # the job showed a checkpoint exists), and a --new-run is dropped (it would move this run's
  # checkpoints aside).
  new=()
  skip=0
  for a in "${cmd[@]}"; do
    if ((skip)); then skip=0; continue; fi
    [[ "$a" == --resume ]] && { skip=1; continue; }
    [[ "$a" == --resume=* || "$a" == --new-run ]] && continue  # --new-run would discard the run
    new+=("$a")
  done
  if [[ -e "$seen_ckpt" ]]; then resume=latest; else resume=auto; fi
  cmd=("${new[@]}" --resume "$resume")
  printf 'mpirun.sh: restart %s:\n' "$what"
done
# Given up on a job that kept stopping or losing a peer: the last line (a scheduler's mail, a
# CI log's tail) says so, with the first failure.
if ((stop_asked == 0 && (rc == 75 || rc == 76) && restarts >= MAX_RESTARTS && restarts > 0)); then
  first="the job printed no error line"
  [[ -s "$first_error" ]] && first=$(head -n 1 "$first_error")
  echo "mpirun.sh: gave up after $restarts restart(s) (MAX_RESTARTS=$MAX_RESTARTS), the job ended with $rc; the first failure: $first" >&2
fi
exit "$rc"
