// The typed state record a checkpoint carries besides its tensors: the loss scaler's state
// and the optimizer's. Plain values, so checkpoints/ needs nothing of the engine; the engine's
// LossScaler and Sgd fill and read them.
#pragma once
#include <cstdint>
#include <string>

namespace spotrain {

// Everything a checkpoint needs to resume fp16 loss scaling exactly.
struct LossScalerState {
  double scale = 1.0;
  int64_t good_steps = 0;         // finite steps since the last change of scale
  int64_t skipped_steps = 0;      // total overflowed steps
  int64_t consecutive_overflows = 0;
};

// The optimizer's step count and hyper-parameters (saved as attributes, for readers).
struct OptimizerRecord {
  int64_t steps = -1;  // -1: the checkpoint holds no optimizer state
  double momentum = 0, weight_decay = 0;
  bool nesterov = false, decay_bn_and_bias = false;
  std::string kind = "sgd";  // "sgd" or "lars" (--optimizer): a resume must ask for the same
  double lars_trust = 0, lars_epsilon = 0;  // written for "lars" only
};

}  // namespace spotrain
