// --ema-decay: an exponential moving average of the weights and of the batch-norm statistics,
// kept on the compute device beside the model and updated after every step:
// ema = decay * ema + (1 - decay) * current. It is evaluated alongside the model, saved in
// checkpoints (group "ema") and restored on resume, so a resumed run continues it exactly.
#pragma once
#include <vector>

#include "core/tensor.h"
#include "engine/model.h"

namespace spotrain {

class WeightEma {
 public:
  // Starts from the model's current weights and statistics.
  WeightEma(Model& model, double decay);
  double decay() const { return decay_; }
  // Starts over from the model's current weights and statistics (a resume from a checkpoint
  // that holds no average).
  void restart();
  // After an optimizer step.
  void update();
  // Exchanges the model's weights and statistics with the averages (call again to undo).
  void swap();
  // Whether the averages are in the model now (between two swaps).
  bool swapped() const { return swapped_; }
  // The averages: flat parameters (as Model::flat_params) and one tensor per BN buffer.
  Tensor& params() { return params_; }
  std::vector<Tensor>& buffers() { return buffers_; }

 private:
  Model& model_;
  double decay_;
  bool swapped_ = false;
  Tensor params_;
  std::vector<Tensor> buffers_;
};

// Evaluates with the averages in the model, and puts the model's own state back after (also
// when evaluation throws).
class EmaSwap {
 public:
  explicit EmaSwap(WeightEma* ema) : ema_(ema) {
    if (ema_) ema_->swap();
  }
  ~EmaSwap() {
    if (ema_) ema_->swap();
  }
  EmaSwap(const EmaSwap&) = delete;
  EmaSwap& operator=(const EmaSwap&) = delete;

 private:
  WeightEma* ema_;
};

}  // namespace spotrain
