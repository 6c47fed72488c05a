// Preemption: SIGTERM, SIGINT and SIGUSR1 only set a flag; the Trainer reads it at each step
// boundary (ranks agree on it), writes a checkpoint and exits with kExitResumable (75), so a
// wrapper or scheduler knows to requeue the job with --resume auto. SIGCONT is noted (when
// it came) and otherwise left alone.
#pragma once

#include <string>

#include "core/exit_codes.h"  // kExitResumable

namespace spotrain {

void install_stop_handlers();
bool stop_requested();
void request_stop();  // what the handlers do; also for tests
// A stop asked for by the program itself (a preemption notice), with why.
void request_stop(const std::string& reason);
// Why the stop was requested: the reason given, else the first stop signal's name ("SIGTERM",
// "SIGUSR1", "SIGINT": a Slurm time limit and a preemption tell apart), else "a stop request".
std::string stop_reason();
// When the first stop was requested, on now_seconds()'s clock (core/clock.h); 0 when none was.
double stop_requested_at();
// When this process last got SIGCONT (0: never). Not a stop: Open MPI's runtime ends a job
// whose rank died by signalling the others SIGCONT, then SIGTERM, then SIGKILL, each
// odls_base_sigkill_timeout apart; the first is the earliest word a survivor gets of it.
double continue_signal_at();

}  // namespace spotrain
