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

}  // namespace spotrain
