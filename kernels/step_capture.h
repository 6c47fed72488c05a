// Captured steps (CUDA Graphs, --cuda-graph): a backend that has them records the device work
// of one training step once and then queues it again with one launch per step. Not an op: the
// step runner (engine/step.h) drives it through Backend::capture(), which is null on backends
// that run steps only as they come (the CPU).
#pragma once
#include <cstddef>
#include <cstdint>

#include "kernels/ops.h"

namespace spotrain {

// One training step's values that a captured step reads from device memory, refilled before
// each replay.
struct StepInputs {
  const int32_t* labels = nullptr;  // n labels, on the host
  const LabelMix* mix = nullptr;    // null: plain labels
  int64_t n = 0;
  float lr = 0;           // sgd_step's (or lars_step's) learning rate
  float loss_scale = 1;   // softmax_xent's grad_scale
  float inv_scale = 1;    // unscale_check_queue's inv_scale
};

class StepCapture {
 public:
  virtual ~StepCapture() = default;
  // Between begin_recording and end_recording the backend's ops are recorded, not run;
  // softmax_xent_queue, sgd_step (or lars_step) and unscale_check_queue then take their labels
  // (and mixed targets), learning rate and scales from device memory that each replay refills
  // from its StepInputs; every other argument, shape and buffer is replayed as recorded.
  virtual void begin_recording(int64_t batch, bool mixed) = 0;
  virtual void end_recording() = 0;
  // Ends a recording that an error cut short (nothing recorded is kept).
  virtual void abort_recording() = 0;
  // Queues the recorded step with these inputs.
  virtual void replay(const StepInputs& in) = 0;
  // Frees a recorded step.
  virtual void drop() = 0;
  // Device memory held for the recorded step's own tensors (0 when none is recorded).
  virtual size_t reserved_bytes() const = 0;
};

}  // namespace spotrain
