#!/usr/bin/env bash
# Times of a spot job across two hosts (network namespaces, tests/netns_hosts.sh; needs root),
# one rank per host under examples/resnet50/launch/mpirun.sh:
#   1. a preemption notice served on host 2 -> every rank exited, the launcher returned (75)
#   2. a restart (--resume auto) -> its first new step logged
#   3. host 2's link cut for good -> the launcher returned (76), nothing left on either host
#   bench/spot_times.sh [MODEL] [BATCH]     (default resnet50 4; build/spotrain)
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
model=${1:-resnet50} batch=${2:-4}
hosts=$repo/tests/netns_hosts.sh P=spt
d=$(mktemp -d /tmp/spot_times.XXXX)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
{ read -r agent; read -r net; } < <($hosts up $P 2)
trap '$hosts down $P; kill $srv 2>/dev/null || true' EXIT
printf '%s.1 slots=1\n%s.2 slots=1\n' "$net" "$net" > $d/hosts
mkdir -p $d/www
ip netns exec $P-2 python3 -m http.server 8808 --bind 127.0.0.1 --directory $d/www > /dev/null 2>&1 &
srv=$!
now() { date +%s.%N; }
since() { awk -v a="$(now)" -v b="$1" 'BEGIN { printf "%.2f", a - b }'; }
launch() {  # launch LOG ARGS...: mpirun.sh in the background, $pid
  local log=$1; shift
  RANKS_PER_NODE=1 THREADS_PER_RANK=1 SPOTRAIN=$repo/build/spotrain MPI_IFNAME=$net.0/24 \
    MPIRUN_ARGS="--mca plm_rsh_agent $agent --mca rtc ^hwloc --mca btl tcp,self" \
    $repo/examples/resnet50/launch/mpirun.sh $d/hosts 2 --model $model --data synthetic \
    --train-limit 100000 --test-limit 8 --batch-size $batch --log-every 1 --steps 1000 \
    --ckpt-dir $d/run --preempt-notice http://127.0.0.1:8808/notice --preempt-poll 1 "$@" > $log 2>&1 &
  pid=$!
}
wait_for() { until grep -qF -e "$2" $1; do kill -0 $pid 2>/dev/null || { cat $1; exit 1; }; sleep 0.05; done; }

launch $d/1.log
wait_for $d/1.log 'step 3/'
t0=$(now); echo terminate > $d/www/notice
rc=0; wait $pid || rc=$?
echo "1. notice on host 2 -> launcher returned: $(since $t0) s (exit $rc; $(grep -o 'stopped by .* after step [0-9]*' $d/1.log | sed 's/ (.*)//'))"
grep -m1 'a stop takes' $d/1.log | sed 's/: give the job.*//' || true
rm $d/www/notice
s=$(grep -o 'after step [0-9]*' $d/1.log | grep -o '[0-9]*$')
t0=$(now); launch $d/2.log --resume auto
wait_for $d/2.log "step $((s + 1))/"
echo "2. restart -> first new step (step $((s + 1))) logged: $(since $t0) s ($(grep -o 'resumed from [^ ]*' $d/2.log))"
wait_for $d/2.log "step $((s + 2))/"
t0=$(now); $hosts cut $P 2
rc=0; wait $pid || rc=$?
t1=$(since $t0)
# Left running on either host (host 2's metadata service, python3, is not the job's).
left() { { $hosts pids $P 1; $hosts pids $P 2; } | grep -v ' python3$' || true; }
for i in $(seq 1 400); do [[ -z "$(left)" ]] && break; sleep 0.1; done
echo "3. link cut -> launcher returned: $t1 s (exit $rc), every process gone $(since $t0) s (--comm-timeout 300)"
du -sh $d/run/ckpt-*.h5 | head -1
rm -rf $d
