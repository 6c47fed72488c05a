// Checkpoint interval from the failure rate (see ckpt_interval.h).
#include "run/ckpt_interval.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/log.h"

namespace spotrain {

double AutoCheckpointInterval::seconds(double stall_s, double write_s) const {
  const double t = young_daly_interval(stall_s, host_mtbf_s / std::max(hosts, 1));
  return std::max(t, write_s);
}

std::string AutoCheckpointInterval::explain(double stall_s, double write_s) const {
  const double job = host_mtbf_s / std::max(hosts, 1);
  const double t = young_daly_interval(stall_s, job);
  std::string s = str("checkpoint interval (--ckpt-every auto): ", fmt_fixed(seconds(stall_s, write_s), 2),
                      " s; Young/Daly sqrt(2 x ", fmt_fixed(stall_s, 4), " s cost x ",
                      fmt_fixed(job, 0), " s job MTBF (", fmt_fixed(host_mtbf_s, 0), " s / ",
                      hosts, " host", hosts == 1 ? "" : "s", ")) = ", fmt_fixed(t, 2), " s");
  if (write_s > t) s += str(", raised to the ", fmt_fixed(write_s, 3), " s background write");
  return s;
}

}  // namespace spotrain
