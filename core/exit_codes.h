// The exit codes of `spotrain`, for launchers and schedulers to act on:
//   0   finished
//   1   error: bad input, bad settings, a bug (one `error:` line on stderr); do not retry
//   2   bad command line or config file
//   75  stopped on request (a signal, a preemption notice, --max-wall-time) after writing a
//       checkpoint: run again with --resume auto
//   76  the job lost a peer (a collective failed or timed out: a rank or a node died, a link
//       broke): an infrastructure failure; retrying with --resume auto is the remedy
#pragma once

namespace spotrain {

constexpr int kExitOk = 0;
constexpr int kExitError = 1;
constexpr int kExitUsage = 2;
constexpr int kExitResumable = 75;
constexpr int kExitRetryable = 76;

// The environment variable a launcher sets to have a finished stop (75 above) exit with
// another code, its own sign that it reads the stop from rank 0's last line instead
// ("stopped by ... after step N; resume with --resume auto"). examples/resnet50/launch/
// mpirun.sh sets 0: Open MPI meets any rank's non-zero exit with its kill sequence, which
// holds mpirun for 2 x odls_base_sigkill_timeout after every rank has already ended.
constexpr const char* kStopExitCodeEnv = "SPOTRAIN_STOP_EXIT_CODE";

// kExitResumable, or kStopExitCodeEnv's value (0-255; anything else is refused with an
// error, so a launcher's typo is caught at start, not after the stop).
int stopped_exit_code();

}  // namespace spotrain
