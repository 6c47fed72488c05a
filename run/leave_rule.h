// --straggler-action leave: when one host's ranks have been stragglers for --straggler-windows
// progress windows in a row (observe/rank_watch.h) -- with shares that follow rates
// (run/rebalance.h), a host too slow even for the smallest share -- whether the job ends sooner
// stopping now with a checkpoint and restarting without that host (run/goodput.h's
// decide_leave, with this run's own measured restart cost). Every rank weighs the same gathered figures at the same
// step, so all reach the same verdict with no extra agreement; the launcher (mpirun.sh with
// HOST_DISCOVERY) reads the verdict's record (MetricsSink::announce) and leaves the host out of
// its next start.
#pragma once
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "comm/comm_worker.h"
#include "observe/rank_watch.h"
#include "run/config.h"
#include "run/global_batch.h"

namespace spotrain {

struct LeaveInputs {
  int64_t step = 0, steps_left = 0;
  const BatchSplit* split = nullptr;         // the job's global batch and shares
  const std::vector<double>* rates = nullptr;  // shares by rate: each rank's images/s (run/rebalance.h)
  double startup_s = 0;       // this process: from its start to its first step done
  double checkpoint_s = 0;    // a checkpoint's write (0 before the first)
  std::string metrics_path;   // rank 0's metrics, for the restarts this run measured ("" = none)
};

class LeaveRule {
 public:
  // Takes the launcher's word (core/environment.h: SPOTRAIN_LEAVE_HOSTS=1 from mpirun.sh with
  // HOST_DISCOVERY, SPOTRAIN_MIN_HOSTS its MIN_HOSTS).
  LeaveRule(const RunConfig& cfg, CommWorker& worker);
  // After a progress window: the reason to stop now ("" = train on). Logs the decision and its
  // figures in one line, once per straggling host (and whenever it leaves). Collective when a
  // host is weighed (rank 0's restart estimate is shared), which every rank reaches alike.
  std::string weigh(const RankWatch& watch, const RankWatch::Window& w, const LeaveInputs& in);
  // The decision's line (for tests and the metrics): "" before any.
  const std::string& last_line() const { return line_; }
  // The host weigh() last decided to leave behind ("" before any).
  const std::string& leaving_host() const { return leaving_; }

 private:
  double restart_estimate(const LeaveInputs& in);
  bool on_ = false, launcher_ok_ = false;
  int windows_ = 3, min_hosts_ = 1;
  int64_t max_micro_;  // --batch-size: what a rank may take on the restart
  CommWorker& worker_;
  std::set<std::string> told_;  // hosts whose "stays" was logged, and why-not reasons said
  std::string line_, leaving_;
};

}  // namespace spotrain
