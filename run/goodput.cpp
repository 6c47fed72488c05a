// The goodput model (see goodput.h; the derivation is docs/SCALING.md's).
#include "run/goodput.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

namespace spotrain {

double young_daly_interval(double cost_s, double job_mtbf_s) {
  return std::sqrt(2.0 * std::max(cost_s, 0.0) * std::max(job_mtbf_s, 0.0));
}

double daly_failure_goodput(double T, double C, double R, double M, bool fail_in_restart) {
  if (M <= 0 || T <= 0) return 1.0;
  const double per_interval = std::expm1((T + C) / M);
  const double wall = fail_in_restart ? M * std::exp(R / M) * per_interval : (M + R) * per_interval;
  return std::min(1.0, T / wall);
}

double survivors_failure_goodput(double M, double survivor_restart_s, double step_s,
                                 double replacement_s, int hosts, double grow_restart_s) {
  if (M <= 0) return 1.0;
  return M / (M + survivor_restart_s + step_s / 2.0 + replacement_s / std::max(hosts, 1) +
              grow_restart_s);
}

Goodput estimate_goodput(const SpotJob& j) {
  Goodput g;
  const int n = std::max(j.hosts, 1);
  if (n > 1 && j.link_bytes_s > 0) {  // a ring all-reduce between hosts, hidden up to `overlap`
    const double ring = 2.0 * (n - 1) / n * j.grad_bytes / j.link_bytes_s + 2.0 * (n - 1) * j.hop_latency_s;
    g.comm_exposed_s = std::max(0.0, ring - j.overlap * j.step_s);
  }
  g.step_efficiency = j.step_s / (j.step_s + g.comm_exposed_s);
  if (j.host_mtbf_s > 0) {
    const double M = j.host_mtbf_s / n;
    const double step = j.step_s + g.comm_exposed_s;
    g.job_mtbf_s = M;
    g.interval_s = std::max(young_daly_interval(j.ckpt_cost_s, M), j.ckpt_write_s);
    // A notice that leaves time for the step under way and a checkpoint: the job stops with
    // one, nothing is lost, and each reclaim costs the stop and the restart.
    g.notice_covers_stop = j.notice_s >= step + j.ckpt_write_s;
    if (j.survivors && n > 1)  // one host has no survivors: a reclaim is a restart
      g.failure_goodput = survivors_failure_goodput(M, j.survivor_restart_s, step, j.replacement_s, n,
                                                    j.grow_restart_s);
    else if (g.notice_covers_stop)
      g.failure_goodput = M / (M + step + j.ckpt_write_s + j.restart_s);
    else
      g.failure_goodput = daly_failure_goodput(g.interval_s, j.ckpt_cost_s, j.restart_s, M);
  }
  g.goodput = g.step_efficiency * g.failure_goodput;
  return g;
}

double predicted_goodput(const MeasuredSpotRun& r) {
  if (r.step_time_s <= 0) return 0.0;
  // Seconds of training per checkpoint; a hard reclaim lands uniformly within one and loses
  // half of it, plus half of the checkpoint's own cost.
  const double T = r.step_time_s / std::max(r.checkpoints, 1.0);
  const double C = r.checkpoint_held_s / std::max(r.checkpoints, 1.0);
  const double lost_each = r.recovery == "survivors" ? 0.0 : (T + C) / 2.0;
  const double wall = r.startup_s + r.step_time_s + r.restarts * r.restart_s + r.preemptions * lost_each;
  return r.step_time_s / wall;
}

double expected_goodput(const MeasuredSpotRun& r) {
  if (r.step_time_s <= 0 || r.hosts <= 0 || r.mtbf_s <= 0) return 0.0;
  const double M = r.mtbf_s / r.hosts;
  const double T = r.step_time_s / std::max(r.checkpoints, 1.0);
  const double C = r.checkpoint_held_s / std::max(r.checkpoints, 1.0);
  // The survivors' form as the simulator runs it: each failure a restart on the hosts left and
  // one more growing back, no lost work.
  const double g = r.recovery == "survivors" ? M / (M + 2 * r.restart_s)
                                             : daly_failure_goodput(T, C, r.restart_s, M, /*fail_in_restart=*/false);
  return r.step_time_s / (r.startup_s + r.step_time_s / g);
}

LeaveDecision decide_leave(const LeaveCase& c) {
  LeaveDecision d;
  const int rest = c.ranks - c.leaving;
  const double steps = double(std::max<int64_t>(0, c.steps_left));
  d.with_s = steps * c.step_s;
  if (rest < 1) {
    d.without_s = std::numeric_limits<double>::infinity();
    return d;
  }
  d.step_without_s = c.others_rate > 0 ? double(c.global_batch) / c.others_rate + c.exposed_s
                                       : c.others_busy_s * double(c.ranks) / double(rest) + c.exposed_s;
  d.without_s = c.restart_s + steps * d.step_without_s;
  d.pays = d.without_s < d.with_s;
  return d;
}

}  // namespace spotrain
