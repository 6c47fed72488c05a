// --fusion auto (the default): each conv, BN+ReLU, conv chain of the model runs fused only
// where timing on the device says it beats the same layers run apart. Timed once, at the first
// training step, on the inputs an evaluation forward of that step's batch meets (chains of one
// shape timed once); the CPU and --deterministic runs keep the layers apart without timing.
#pragma once
#include <string>
#include <vector>

#include "engine/model.h"

namespace spotrain {

struct FusionVerdict {
  std::string chain;             // FusionChain::name()
  double fused_ms = 0, apart_ms = 0;  // forward and backward, the best of the timed runs
  bool fused = false;
};

// The chain is fused where its fused run takes at most this share of the separate layers'.
constexpr double kFusionWinsBelow = 0.98;

// Times every chain of `model` both ways on `x` (a batch in the compute dtype, as a training
// step gets it) and switches each on where it wins. Changes no weight, statistic or gradient.
// Where the timing fails (say, out of memory) every chain is switched off, a warning logged,
// and nothing returned.
std::vector<FusionVerdict> choose_fusion(Model& model, const Tensor& x);
// Switches every chain of `model` on or off.
void set_fusion(Model& model, bool on);
// One line: how many chains were fused and the time both ways.
std::string fusion_summary(const std::vector<FusionVerdict>& v);

}  // namespace spotrain
