// LeaveRule (see leave_rule.h).
#include "run/leave_rule.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>

#include "core/environment.h"
#include "core/error.h"
#include "core/log.h"
#include "run/goodput.h"
#include "run/plan.h"
#include "run/global_batch.h"

namespace spotrain {

namespace {
std::string windows(int n) { return str(n, n == 1 ? " window" : " windows"); }
}  // namespace

LeaveRule::LeaveRule(const RunConfig& cfg, CommWorker& worker)
    : on_(cfg.straggler_action == "leave"),
      launcher_ok_(launcher_settings().leave_hosts),
      windows_(cfg.straggler_windows),
      min_hosts_(launcher_settings().min_hosts),
      max_micro_(cfg.batch_size),
      worker_(worker) {
  if (on_ && !launcher_ok_)
    log_info("--straggler-action leave: not started by mpirun.sh with HOST_DISCOVERY, which restarts "
             "a job without a host; stragglers are only named (as warn)");
}

double LeaveRule::restart_estimate(const LeaveInputs& in) {
  // Rank 0's: the median restart this run measured (its metrics), else this process's own
  // start-up and a checkpoint's write; shared so that every rank weighs the same figure.
  double v = 0;
  if (worker_.comm().rank() == 0) {
    v = in.startup_s + in.checkpoint_s;
    if (!in.metrics_path.empty() && std::ifstream(in.metrics_path).good()) {
      try {
        const RunCosts c = costs_from(in.metrics_path);
        if (c.restart_source.rfind("default", 0) != 0) v = c.restart_s + in.checkpoint_s;
      } catch (const std::exception&) {  // a metrics file it cannot read: the start-up stands
      }
    }
  }
  sum_across_ranks(worker_, &v, 1, "the restart estimate");
  return v;
}

std::string LeaveRule::weigh(const RankWatch& watch, const RankWatch::Window& w, const LeaveInputs& in) {
  if (!on_ || !launcher_ok_ || w.stragglers.empty()) return "";
  // The slowest straggler named for enough windows in a row.
  const Straggler* worst = nullptr;
  for (const Straggler& s : w.stragglers)
    if (watch.streak(s.rank) >= windows_ && (!worst || s.ratio() > worst->ratio())) worst = &s;
  if (!worst) return "";
  const std::vector<std::string>& hosts = watch.hosts();
  const std::string host = hosts[size_t(worst->rank)];
  const int ranks = int(hosts.size());
  const int leaving = int(std::count(hosts.begin(), hosts.end(), host));
  const int host_count = int(std::set<std::string>(hosts.begin(), hosts.end()).size());
  auto once = [&](const std::string& key, const std::string& line) {
    if (told_.insert(key).second) {
      line_ = line;
      log_info(line);
    }
    return std::string();
  };
  if (host_count - 1 < min_hosts_)
    return once("min:" + host, str("straggler: host ", host, " stays: without it ", host_count - 1,
                                   " host(s) would be left, fewer than MIN_HOSTS=", min_hosts_));
  BatchSplit without;
  std::string why_not;
  if (!split_evenly(in.split->global(), ranks - leaving, max_micro_, &without, &why_not))
    return once("batch:" + host, str("straggler: host ", host, " stays: ", why_not));
  // The figures: today's step is the slowest rank's; without the host, the slowest of the others.
  LeaveCase c;
  c.ranks = ranks;
  c.leaving = leaving;
  c.steps_left = in.steps_left;
  double slowest = 0, least_wait = INFINITY;
  for (size_t r = 0; r < w.ranks.size(); ++r) {
    slowest = std::max(slowest, w.ranks[r].busy() + w.ranks[r].wait);
    least_wait = std::min(least_wait, w.ranks[r].wait);
    if (hosts[r] != host) c.others_busy_s = std::max(c.others_busy_s, w.ranks[r].busy());
  }
  c.step_s = slowest;
  c.exposed_s = std::isfinite(least_wait) ? least_wait : 0;
  const bool rated = in.rates && std::all_of(in.rates->begin(), in.rates->end(), [](double r) { return r > 0; });
  if (rated && in.split->units() >= int64_t(ranks)) {
    // Shares that follow rates: staying, the step is the best split's at these rates; leaving,
    // the restart rebalances too (the global batch over the others' summed rates).
    c.global_batch = in.split->global();
    const std::vector<int> best = counts_by_rate(in.split->units(), *in.rates);
    double step = 0;
    for (size_t r = 0; r < best.size(); ++r) {
      step = std::max(step, double(best[r] * in.split->micro) / (*in.rates)[r]);
      if (hosts[r] != host) c.others_rate += (*in.rates)[r];
    }
    c.step_s = step + c.exposed_s;
  }
  c.restart_s = restart_estimate(in);
  const LeaveDecision d = decide_leave(c);
  const std::string figures =
      str("the remaining ", in.steps_left, " steps take ", fmt_duration(d.with_s), " at ",
          fmt_fixed(c.step_s, 3), " s/step with it, ", fmt_duration(d.without_s), " without (a restart of ",
          fmt_fixed(c.restart_s, 1), " s, then ", fmt_fixed(d.step_without_s, 3), " s/step on ", ranks - leaving,
          " of ", ranks, " ranks)");
  if (!d.pays)
    return once("stay:" + host, str("straggler: host ", host, " stays (", watch.describe(*worst), " for ",
                                    windows(watch.streak(worst->rank)), "): ", figures));
  leaving_ = host;
  line_ = str("straggler: leaving host ", host, " behind (", watch.describe(*worst), " for ",
              windows(watch.streak(worst->rank)), "): ", figures);
  log_info(line_);
  return str("leaving straggler host ", host);
}

}  // namespace spotrain
