#!/usr/bin/env bash
# Multi-node launch of `spotrain train` with Open MPI and a hostfile: one process (rank) per
# GPU, or per CPU share of a node, on every host listed. Prints the mpirun command it runs.
#
#   examples/resnet50/launch/mpirun.sh HOSTFILE NP [spotrain train arguments...]
#
#   HOSTFILE  Open MPI hostfile, one node a line: `node01 slots=8` (see hosts.example)
#   NP        total number of ranks (at most nodes x RANKS_PER_NODE)
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
#   MAX_RESTARTS      restart the job up to this many times (default 0) when it ends resumably:
#                     75 (stopped with a checkpoint by spotrain itself, e.g. --max-wall-time or
#                     a signal to a rank) or 76 (a peer was lost: a rank or node died, a link
#                     broke); each restart adds --resume auto. Not after a stop signal to this
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

[[ -e "$HOSTFILE" ]] || die "hostfile '$HOSTFILE' does not exist; write one line per node, e.g. 'node01 slots=8' (see examples/resnet50/launch/hosts.example)"
[[ -f "$HOSTFILE" && -r "$HOSTFILE" ]] || die "hostfile '$HOSTFILE' is not a readable file"
[[ "$NP" =~ ^[1-9][0-9]*$ ]] || die "NP must be a positive number of ranks, got '$NP'"

RANKS_PER_NODE=${RANKS_PER_NODE:-1}
[[ "$RANKS_PER_NODE" =~ ^[1-9][0-9]*$ ]] || die "RANKS_PER_NODE must be a positive number, got '$RANKS_PER_NODE'"
THREADS_PER_RANK=${THREADS_PER_RANK:-}
[[ -z "$THREADS_PER_RANK" || "$THREADS_PER_RANK" =~ ^[1-9][0-9]*$ ]] ||
  die "THREADS_PER_RANK must be a positive number, got '$THREADS_PER_RANK'"
BIND_TO=${BIND_TO:-none}
[[ "$BIND_TO" == none || "$BIND_TO" == core ]] || die "BIND_TO must be none or core, got '$BIND_TO'"
[[ "$BIND_TO" == none || -n "$THREADS_PER_RANK" ]] || die "BIND_TO=core needs THREADS_PER_RANK (cores per rank)"

# Nodes in the hostfile: lines that are not blank or comments.
NODES=$(grep -cvE '^[[:space:]]*(#|$)' "$HOSTFILE" || true)
((NODES > 0)) || die "hostfile '$HOSTFILE' lists no nodes"
((NP <= NODES * RANKS_PER_NODE)) ||
  die "NP=$NP ranks do not fit on $NODES node(s) x RANKS_PER_NODE=$RANKS_PER_NODE; add nodes or raise RANKS_PER_NODE"

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

cmd=("$MPIRUN" --hostfile "$HOSTFILE" -np "$NP")
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
if [[ -n "${MPI_IFNAME:-}" ]]; then
  cmd+=(--mca btl_tcp_if_include "$MPI_IFNAME" --mca oob_tcp_if_include "$MPI_IFNAME")
fi
for v in NCCL_SOCKET_IFNAME NCCL_IB_HCA NCCL_DEBUG OMP_NUM_THREADS LD_LIBRARY_PATH PATH \
         SPOTRAIN_FAULT ${EXTRA_ENV:-}; do
  [[ -n "${!v+set}" ]] && cmd+=(-x "$v")
done
if [[ -n "${MPIRUN_ARGS:-}" ]]; then
  read -r -a extra <<<"$MPIRUN_ARGS"
  cmd+=("${extra[@]}")
fi
cmd+=("$SPOTRAIN" train ${args[@]+"${args[@]}"})

printf 'mpirun.sh: %d rank(s) on %d node(s) from %s\n+' "$NP" "$NODES" "$HOSTFILE"
printf ' %q' "${cmd[@]}"
printf '\n'
[[ "${DRY_RUN:-0}" == 1 ]] && exit 0

# Preemption. A scheduler's stop (scancel, a pod deletion, Ctrl-C) signals this script, the
# launcher. Open MPI's mpirun meets SIGTERM or SIGINT by killing the ranks (SIGKILL about a
# second after its own SIGTERM, odls_base_sigkill_timeout), which loses the stop checkpoint;
# SIGUSR1 it forwards to every rank at once and leaves them be. So mpirun runs as a child here
# and TERM, INT and USR1 all reach it as SIGUSR1: every rank finishes its step, rank 0 writes
# and verifies the stop checkpoint, all exit 75, and so do mpirun and this script.
MAX_RESTARTS=${MAX_RESTARTS:-0}
[[ "$MAX_RESTARTS" =~ ^[0-9]+$ ]] || die "MAX_RESTARTS must be a number, got '$MAX_RESTARTS'"
delay=${RESTART_DELAY:-10}
[[ "$delay" =~ ^[0-9]+$ ]] || die "RESTART_DELAY must be a number of seconds, got '$delay'"
delay_max=${RESTART_DELAY_MAX:-300}
[[ "$delay_max" =~ ^[0-9]+$ ]] || die "RESTART_DELAY_MAX must be a number of seconds, got '$delay_max'"
stop_asked=0
mpirun_pid=
forward_stop() {
  stop_asked=1
  signalled=1
  [[ -n "$mpirun_pid" ]] && kill -USR1 "$mpirun_pid" 2>/dev/null || true
}
trap forward_stop TERM INT USR1
restarts=0
while :; do
  "${cmd[@]}" &
  mpirun_pid=$!
  ((stop_asked)) && kill -USR1 "$mpirun_pid" 2>/dev/null  # a stop that came while starting
  while :; do
    signalled=0
    rc=0
    wait "$mpirun_pid" || rc=$?
    ((signalled)) || break  # a trapped signal cut the wait short: mpirun still runs
  done
  mpirun_pid=
  # Open MPI's "lost communication with a remote daemon" (205): a node is gone, as 76.
  ((rc == 205)) && rc=76
  # Restart only what a restart can mend, and never what this script was asked to stop.
  ((stop_asked == 0 && (rc == 75 || rc == 76) && restarts < MAX_RESTARTS)) || break
  restarts=$((restarts + 1))
  echo "mpirun.sh: the job ended with $rc; restart $restarts of $MAX_RESTARTS in ${delay} s with --resume auto" >&2
  sleep "$delay" &
  wait $! || true
  ((stop_asked == 0)) || break
  delay=$((delay * 2 > delay_max ? delay_max : delay * 2))
  # The same command, resuming: any --resume given is replaced by --resume auto, and a
  # --new-run is dropped (it would move this run's checkpoints aside).
  new=()
  skip=0
  for a in "${cmd[@]}"; do
    if ((skip)); then skip=0; continue; fi
    [[ "$a" == --resume ]] && { skip=1; continue; }
    [[ "$a" == --resume=* || "$a" == --new-run ]] && continue  # --new-run would discard the run
    new+=("$a")
  done
  cmd=("${new[@]}" --resume auto)
  printf 'mpirun.sh: restart %d:\n+' "$restarts"
  printf ' %q' "${cmd[@]}"
  printf '\n'
done
exit "$rc"
