// When a run stops early, with a checkpoint and exit 75: a stop signal (SIGTERM, SIGINT,
// SIGUSR1; spot/preemption.h) on any rank, or --max-wall-time about to pass. Each rank
// sets its flag before a step; the flags travel with the step's last gradient bucket (the
// GradSync control slot), so every rank learns of every flag at no extra round trip and all
// stop after the same step. Also says once what a stop costs, so launchers allow for it.
// With several ranks it also tells the collectives a peer is lost when a stop was asked for
// (or the launcher sent SIGCONT, its first word of a job's end), no collective has finished
// since, and the one waited for is still unfinished long after: the launcher is ending a job
// whose rank died, which never joins.
#pragma once
#include <string>

#include "comm/comm_worker.h"
#include "engine/grad_sync.h"

namespace spotrain {

class StopPolicy {
 public:
  // max_wall_time: as --max-wall-time ("" = none), counted from started_at; sync: nullptr
  // on one rank; worker: watched for a lost peer (with several ranks), until destroyed.
  StopPolicy(const std::string& max_wall_time, double started_at, GradSync* sync,
             CommWorker* worker = nullptr);
  ~StopPolicy();
  StopPolicy(const StopPolicy&) = delete;
  StopPolicy& operator=(const StopPolicy&) = delete;
  // How long after a stop request an unfinished collective means a lost peer: three steps,
  // and at least kMinAfterStop (ranks that are alive all reach the stop's step by then). After
  // the launcher's SIGCONT, kAfterContinue: the launcher is ending the job (its SIGKILL follows
  // 2 x mpirun.sh's SURVIVOR_WAIT after it), so only a collective about to finish is waited for.
  double loss_seconds_after_stop() const;
  static constexpr double kMinAfterStop = 10, kAfterContinue = 1;
  // Before a step: this rank's reason to stop ("" = none), sent to the other ranks.
  void before_step();
  // After a step, with the latest step's seconds, the steady-state step time (0 while warming
  // up; observe/steady_steps.h) and what a checkpoint costs to write (0 before the first): why
  // the run stops now ("" = it goes on). The margins take the steady time once there is one,
  // the latest step's before; what a stop costs is said once both are known.
  std::string after_step(double latest_step_seconds, double steady_step_seconds,
                         double checkpoint_seconds);

 private:
  bool wall_near() const;
  std::string wall_text_;
  double wall_limit_ = 0, started_at_;
  GradSync* sync_;
  CommWorker* worker_;
  std::string reason_;  // this rank's, set before the step
  double step_seconds_ = 0, checkpoint_seconds_ = 0;
  bool cost_logged_ = false;
};

}  // namespace spotrain
