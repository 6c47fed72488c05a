// --fusion auto|bn|none: what the model is built with (fusion_mode), and, for auto (the
// default), which conv, BN+ReLU, conv chains run fused: only those where timing on the device
// says they beat the same layers run apart, and only while the fused runs compute what the
// layers apart do (their first-use check, engine/fast_paths.h). Decided once, at the first
// training step, on the inputs a scratch training forward of that step's batch meets (chains
// of one shape timed once), kept in the kernel cache, and taken from rank 0 by every rank.
#pragma once
#include <string>
#include <vector>

#include "comm/comm_worker.h"
#include "engine/fast_paths.h"
#include "engine/model.h"

namespace spotrain {

// --fusion made into what the model is built with (ResNetOptions::fusion_links, fusion_on)
// and whether the first training step chooses (StepRunner::choose_fusion_at_first_step).
struct FusionMode {
  bool links = false;   // the chains are linked
  bool on = false;      // and start fused
  bool choose = false;  // choose_fusion decides each at the first step
};
// none: no links. bn: linked and fused. auto: linked and apart, and chosen at the first step
// where `be` runs the fused ops as fused kernels at `compute` (composed of the separate ops,
// as on the CPU, at fp32/tf32 or under --deterministic on a GPU, they cannot win: the chains
// stay apart untimed). Throws Error, naming the choices, for anything else.
FusionMode fusion_mode(const std::string& setting, const Backend& be, DType compute);

struct FusionVerdict {
  std::string chain;             // FusionChain::name()
  double fused_ms = 0, apart_ms = 0;  // forward and backward, the best of the timed runs
  bool fused = false;
  bool cached = false;  // the times came from the kernel cache: not timed in this run
  // Timed on kernels the backend took untimed (Backend::kernel_timing_cut: its budget for
  // timing fused graphs was spent): taken in this run, not kept in the kernel cache, so that
  // a restart, which times those kernels, times the chain again.
  bool provisional = false;
};

// The chain is fused where its fused run takes at most this share of the separate layers'.
constexpr double kFusionWinsBelow = 0.98;
// Runs of a chain queued back to back between two marks of the device clock (after one more
// that fills the queue): see time_ms in fusion_choice.cpp.
constexpr int kFusionRunsPerMark = 3;

// Times every chain of `model` both ways on the inputs that `x` (a batch in the compute dtype,
// as a training step gets it) meets in a scratch training forward, and switches each on where
// it wins. Shapes whose verdict the backend's kernel cache holds are not timed; new verdicts
// are put there, except those timed once the backend's kernel timing was cut (provisional).
// In the same runs, each shape's fused run is checked against its run apart
// (output, input gradient, parameter gradients; normalized difference within
// fast_path_tolerance): where one differs, every chain runs apart for the whole run, with one
// warning naming the chain, the tensor and the difference, and `checks` records it. Where
// `checks` says fusion is off already, nothing is timed and every chain runs apart (one line
// says why). `checks` may be null (no verdicts kept; a failure is then logged here).
// `ranks` (null on one rank): every rank then runs rank 0's on/off list, or every chain apart
// where any rank could not fuse (its check failed or was off, or its timing failed).
// Changes no weight, statistic or gradient. Where the timing fails (say, out of memory) every
// chain is switched off and a warning logged. Returns the verdicts (this rank's times, the
// agreed on/off), or nothing where every chain was switched off for one of those reasons.
std::vector<FusionVerdict> choose_fusion(Model& model, const Tensor& x,
                                         FastPathChecks* checks = nullptr,
                                         CommWorker* ranks = nullptr);
// Switches every chain of `model` on or off.
void set_fusion(Model& model, bool on);
// One line: how many chains were fused and the time both ways.
std::string fusion_summary(const std::vector<FusionVerdict>& v);

}  // namespace spotrain
