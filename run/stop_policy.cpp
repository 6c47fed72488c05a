// StopPolicy (see stop_policy.h).
#include "run/stop_policy.h"

#include <algorithm>

#include "spot/preemption.h"
#include "core/clock.h"
#include "run/config.h"  // parse_duration
#include "core/log.h"

namespace spotrain {


StopPolicy::StopPolicy(const std::string& max_wall_time, double started_at, GradSync* sync,
                       CommWorker* worker)
    : wall_text_(max_wall_time), started_at_(started_at), sync_(sync), worker_(worker) {
  if (!max_wall_time.empty()) wall_limit_ = parse_duration(max_wall_time);
  install_stop_handlers();
  if (worker_ && worker_->comm().size() > 1)
    worker_->watch_for_loss([this](double wait_started, double last_finished) {
      // A stop asked for, or the launcher's first signal of a job's end (spot/preemption.h),
      // that came after the last collective finished, and this wait stuck long past it: a
      // signal that collectives finished after (a stop's own step, an old SIGCONT) says nothing.
      const double now = now_seconds();
      auto stuck_since = [&](double signal, double limit) {
        return signal > last_finished && now - std::max(signal, wait_started) > limit;
      };
      return stuck_since(continue_signal_at(), kAfterContinue) ||
             stuck_since(stop_requested_at(), loss_seconds_after_stop());
    });
}

StopPolicy::~StopPolicy() {
  if (worker_) worker_->watch_for_loss(nullptr);
}

double StopPolicy::loss_seconds_after_stop() const {
  return std::max(kMinAfterStop, 3 * step_seconds_);
}

// Whether --max-wall-time leaves no room for two more steps and a checkpoint.
bool StopPolicy::wall_near() const {
  if (wall_limit_ <= 0) return false;
  double margin = std::min(5.0, 0.05 * wall_limit_);
  return now_seconds() - started_at_ + 2 * step_seconds_ + checkpoint_seconds_ + margin > wall_limit_;
}

void StopPolicy::before_step() {
  reason_ = stop_requested() ? stop_reason() : wall_near() ? "--max-wall-time" : "";
  if (sync_) sync_->set_control(kStopSlot, reason_.empty() ? 0.f : 1.f);
}

std::string StopPolicy::after_step(double latest_step_seconds, double steady_step_seconds,
                                   double checkpoint_seconds) {
  step_seconds_ = steady_step_seconds > 0 ? steady_step_seconds : latest_step_seconds;
  checkpoint_seconds_ = checkpoint_seconds;
  // What a stop costs, once the first checkpoint has been written and the steps are steady:
  // the step under way, then a synchronous write with fsync and verification. Launchers must
  // allow that.
  if (!cost_logged_ && checkpoint_seconds > 0 && steady_step_seconds > 0) {
    cost_logged_ = true;
    log_info(str("a stop takes about ", fmt_fixed(steady_step_seconds + checkpoint_seconds, 1),
                 " s (the step under way ", fmt_fixed(steady_step_seconds, 1),
                 " s, the median of the latest steps, + writing and verifying a checkpoint ",
                 fmt_fixed(checkpoint_seconds, 1),
                 " s): give the job at least that much time between the stop signal and a kill "
                 "(docs/MULTI_NODE.md, 'Stopping it')"));
  }
  std::string reason = reason_;
  if (sync_) {
    const bool any = sync_->control(kStopSlot) > 0;  // every rank's flag, summed
    // Ours may have come during the step (a notice seen a moment after another rank's).
    if (any && reason.empty()) reason = stop_requested() ? stop_reason() : "a stop request on another rank";
    if (!any) reason.clear();
  } else if (reason.empty() && stop_requested()) {
    reason = stop_reason();
  }
  if (reason == "--max-wall-time") log_info(str("--max-wall-time ", wall_text_, " is near: stopping"));
  return reason;
}

}  // namespace spotrain
