#!/usr/bin/env bash
# A worker pod's main process for the Kubeflow MPI Operator (mpijob.yaml): sshd, through which
# the launcher's mpirun starts this pod's ranks, plus the stop protocol. A SIGTERM to the pod (a
# spot reclaim, a drain, a deletion) reaches every spotrain rank of the pod as SIGTERM, so the
# ranks agree on a stop with all the others, rank 0 writes and verifies a checkpoint, and the
# job exits 75; only then is sshd stopped. (With sshd alone as the main process the ranks die
# with it, without a checkpoint.) Run it under an init that forwards signals:
#   command: ["/usr/bin/tini", "--", "/usr/local/bin/spotrain-worker"]
# Settings (environment):
#   SSHD        the ssh daemon's command line (default "/usr/sbin/sshd -De")
#   STOP_WAIT   seconds to wait for the ranks after a stop signal (default 600); keep the pod's
#               terminationGracePeriodSeconds above the "a stop takes about N s" the run logs
set -u
read -r -a sshd <<<"${SSHD:-/usr/sbin/sshd -De}"
stop_wait=${STOP_WAIT:-600}
[[ "$stop_wait" =~ ^[0-9]+$ ]] || { echo "error: STOP_WAIT must be a number of seconds, got '$stop_wait'" >&2; exit 2; }

stop() {
  trap '' TERM INT
  if pgrep -x spotrain >/dev/null; then
    echo "spotrain-worker: stop signal: asking this pod's ranks to stop with a checkpoint" >&2
    pkill -TERM -x spotrain || true
    for ((i = 0; i < stop_wait * 10; i++)); do
      pgrep -x spotrain >/dev/null || break
      sleep 0.1
    done
    pgrep -x spotrain >/dev/null && echo "spotrain-worker: ranks still running after ${stop_wait} s" >&2
  fi
  kill -TERM "$sshd_pid" 2>/dev/null
  wait "$sshd_pid" 2>/dev/null
  exit 0
}
trap stop TERM INT
"${sshd[@]}" &
sshd_pid=$!
rc=0
wait "$sshd_pid" || rc=$?  # a trapped signal runs stop(); sshd ending on its own ends the pod
exit "$rc"
