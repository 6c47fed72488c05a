// Preemption: SIGTERM, SIGINT and SIGUSR1 only set a flag; the Trainer reads it at each step
// boundary (ranks agree on it), writes a checkpoint and exits with kExitResumable (75), so a
// wrapper or scheduler knows to requeue the job with --resume auto.
#pragma once

namespace spotrain {

constexpr int kExitResumable = 75;

void install_stop_handlers();
bool stop_requested();
void request_stop();  // what the handlers do; also for tests

}  // namespace spotrain
