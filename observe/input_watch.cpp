// InputWatch (see input_watch.h).
#include "observe/input_watch.h"

#include "core/error.h"
#include "core/log.h"

namespace spotrain {

std::string InputWatch::add(int64_t first_step, int64_t last_step, double wait_seconds,
                            double seconds, std::optional<double> sm_util) {
  if (warned_) return "";
  if (from_ < 0) from_ = first_step;
  steps_ += last_step - first_step + 1;
  wait_ += wait_seconds;
  seconds_ += seconds;
  if (sm_util) {
    sm_sum_ += *sm_util;
    ++sm_n_;
  }
  if (steps_ < kMinSteps) return "";
  const double share = seconds_ > 0 ? wait_ / seconds_ : 0;
  const std::optional<double> sm = sm_n_ ? std::optional<double>(sm_sum_ / sm_n_) : std::nullopt;
  const bool bound = input_bound(share, sm);
  const int64_t from = from_;
  from_ = -1;
  steps_ = 0;
  wait_ = seconds_ = sm_sum_ = 0;
  sm_n_ = 0;
  if (!bound) return "";
  warned_ = true;
  share_ = share;
  judged_from_ = from;
  judged_to_ = last_step;
  return str("warning: input-bound: steps ", from, "-", last_step, " waited ", fmt_fixed(100 * share, 1),
             "% of their time for data",
             sm ? str(" while the GPU's SM utilisation averaged ", fmt_fixed(*sm, 0), "%") : std::string(),
             ". Try more loader threads (--workers, now ", workers_,
             "), packed shards (spotrain data pack) on local storage, or smaller images to decode "
             "(pre-resized JPEGs); said once per run");
}

}  // namespace spotrain
