// How often to checkpoint when hosts fail at random (--ckpt-every auto --mtbf D): Young's
// first-order optimum of the interval between checkpoints (Young 1974, Daly 2006),
// T = sqrt(2 C M), for a checkpoint that costs C seconds of training and a job whose mean time
// between failures is M, the MTBF of one host divided by the hosts (any one failing stops all).
#pragma once
#include <string>

#include "run/goodput.h"  // young_daly_interval: the one model

namespace spotrain {


struct AutoCheckpointInterval {
  double host_mtbf_s = 0;  // --mtbf
  int hosts = 1;           // nodes of the job

  // The interval, in seconds, for a checkpoint that costs training `stall_s` and is written
  // in the background in `write_s`: Young/Daly on the cost, and at least the write (one
  // write in flight at a time; what the writer's work takes from training is in the cost).
  double seconds(double stall_s, double write_s) const;
  // One line saying how seconds() came out, with its inputs.
  std::string explain(double stall_s, double write_s) const;
};

}  // namespace spotrain
