// Reducer (DDP-style): a flat gradient buffer (the model's, already in reverse layer order) is
// cut into buckets of --bucket-mb (the first one smaller, so communication starts early).
// Backward reports each parameter's gradient (by its index) as it is written; when a bucket's last
// gradient arrives its all-reduce (sum) starts on the CommWorker thread while backward goes
// on (on GPU ranks the NCCL all-reduce waits on the GPU, through an event, for the backward
// work that wrote the bucket). finish() waits for every bucket. Optional fp16/bf16
// compression all-reduces 16-bit copies (pre-divided by the world size so fp16 cannot
// overflow on the sum).
// Control values (the ranks' stop flags) ride along with the last bucket: the `tail` slots
// right after the gradients in the same buffer are summed with it, so agreeing costs no extra
// round trip (the caller writes them before the step and reads the sums after finish()).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "comm/comm_worker.h"
#include "core/tensor.h"

namespace spotrain {

struct ReducerOptions {
  double bucket_mb = 25;
  double first_bucket_mb = 1;
  std::string compression = "none";  // none | fp16 | bf16
};

// One parameter's gradient: elements [offset, offset + count) of the flat buffer.
struct GradRange {
  int64_t offset = 0, count = 0;
};

class Reducer {
 public:
  // `grads`: the flat fp32 gradients followed by `tail` control slots, in one buffer (host or
  // device); `ranges`: each parameter's part of it, indexed as grad_ready's argument.
  Reducer(Tensor grads, int64_t tail, std::vector<GradRange> ranges, CommWorker& worker,
          const ReducerOptions& opt);
  // Called during backward for each parameter (index into `ranges`) whose gradient is complete.
  void grad_ready(size_t param);
  // Launches any bucket not launched yet, then waits for all; the flat gradients then hold
  // the SUM over ranks. Returns the seconds spent waiting (exposed communication).
  double finish();
  size_t num_buckets() const { return buckets_.size(); }

 private:
  struct Bucket {
    int64_t begin = 0, end = 0;  // element range of the flat buffer
    int params = 0, ready = 0;
    bool launched = false;
    uint64_t ticket = 0;
  };
  void launch(Bucket& b);

  Tensor grads_;  // P gradients + tail_ control slots
  int64_t tail_;
  CommWorker& worker_;
  ReducerOptions opt_;
  std::vector<Bucket> buckets_;
  std::vector<int> bucket_of_param_;  // by parameter index
  std::vector<uint16_t> scratch_;     // compression buffer
  int64_t tail_bucket_ = -1;          // the bucket ending at the flat buffer's end
};

}  // namespace spotrain
