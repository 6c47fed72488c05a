#!/usr/bin/env bash
# A worker pod's main process for the Kubeflow MPI Operator (mpijob.yaml): sshd, through which
# the launcher's mpirun starts this pod's ranks, plus the stop protocol. A SIGTERM to the pod (a
# spot reclaim, a drain, a deletion) reaches every spotrain rank of the pod as SIGTERM, so the
# ranks agree on a stop with all the others, rank 0 writes and verifies a checkpoint, and the
# job exits 75; only then is sshd stopped. (With sshd alone as the main process the ranks die
# with it, without a checkpoint.) Run it under an init that forwards signals:
#   command: ["/usr/bin/tini", "--", "/usr/local/bin/spotrain-worker"]
# Exit status: after a stop signal 128 + its number (143 for SIGTERM, 130 for SIGINT), never 0,
# so that the worker comes back. The MPI Operator creates a worker pod only where none of its
# name exists and leaves one that has ended as it is (Succeeded or Failed), so a worker must not
# end Succeeded: with the Worker's restartPolicy OnFailure (mpijob.yaml) the kubelet starts this
# script again in the same pod, and a pod that is deleted instead (drain, kubectl delete, its
# node removed) the operator replaces. 128 + N is also what a shell reports for "ended by signal
# N", and what Kubeflow's ExitCode restart policy counts as retryable (128-255; 1-127 are
# permanent). When sshd ends on its own, its exit status.
# Settings (environment):
#   SSHD        the ssh daemon's command line (default "/usr/sbin/sshd -De")
#   STOP_WAIT   seconds to wait for the ranks after a stop signal (default 600; 0 to 999999);
#               keep the pod's terminationGracePeriodSeconds above the "a stop takes about N s"
#               the run logs
set -u
read -r -a sshd <<<"${SSHD:-/usr/sbin/sshd -De}"
((${#sshd[@]})) || { echo "error: SSHD must be the ssh daemon's command line, got '${SSHD:-}'" >&2; exit 2; }
stop_wait=${STOP_WAIT:-600}
[[ "$stop_wait" =~ ^[0-9]{1,6}$ ]] ||
  { echo "error: STOP_WAIT must be a number of seconds (0 to 999999), got '$stop_wait'" >&2; exit 2; }
stop_wait=$((10#$stop_wait))  # "010" is ten seconds, not octal ("08" would be an error)

# A stop signal (its number in $1): SIGTERM to this pod's ranks, up to STOP_WAIT s for them to
# end, then sshd; exit 128 + the signal's number.
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
  if [[ -n "$sshd_pid" ]]; then
    kill -TERM "$sshd_pid" 2>/dev/null
    wait "$sshd_pid" 2>/dev/null
  fi
  exit $((128 + $1))
}
sshd_pid=
trap 'stop 15' TERM
trap 'stop 2' INT
"${sshd[@]}" &
sshd_pid=$!
rc=0
wait "$sshd_pid" || rc=$?  # a trapped signal runs stop(); sshd ending on its own ends the pod
exit "$rc"
