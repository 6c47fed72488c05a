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

// The optimizer's hyper-parameters as a run sets them: engine/optimizer.h's SgdOptions is this
// struct, and a checkpoint keeps them as attributes, for readers.
struct OptimizerSettings {
  float momentum = 0.9f;
  bool nesterov = false;
  float weight_decay = 5e-5f;
  bool decay_bn_and_bias = false;  // false: BN scale/shift and biases get no weight decay
  // "sgd" or "lars" (--optimizer: a resume must ask for the same). LARS's defaults are the
  // MLPerf reference's (mlcommons/training, image_classification/tensorflow2/lars_optimizer.py:
  // eeta=0.001; epsilon 0.0 there becomes Keras's backend epsilon, 1e-7, by `epsilon or
  // backend_config.epsilon()`). With decay_bn_and_bias, BN and bias parameters are adapted and
  // decayed like the others. A checkpoint writes the LARS settings for "lars" only.
  std::string kind = "sgd";
  float lars_trust = 0.001f;
  float lars_epsilon = 1e-7f;
};

// The optimizer's step count and settings.
struct OptimizerRecord : OptimizerSettings {
  int64_t steps = -1;  // -1: the checkpoint holds no optimizer state
};

}  // namespace spotrain
