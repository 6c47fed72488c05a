// Preemption: SIGTERM, SIGINT and SIGUSR1 only set a flag; the Trainer reads it at each step
// boundary (ranks agree on it), writes a checkpoint and exits with kExitResumable (75), so a
// wrapper or scheduler knows to requeue the job with --resume auto.
#pragma once

#include <string>

#include "core/exit_codes.h"  // kExitResumable

namespace spotrain {

void install_stop_handlers();
bool stop_requested();
void request_stop();  // what the handlers do; also for tests
// A stop asked for by the program itself (a preemption notice), with why.
void request_stop(const std::string& reason);
// Why the stop was requested: the reason given, else "a signal".
std::string stop_reason();

}  // namespace spotrain
