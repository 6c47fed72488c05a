// Reducer (DDP-style): the model's flat gradient buffer, already in reverse layer order, is
// cut into buckets of --bucket-mb (the first one smaller, so communication starts early).
// Backward reports each parameter's gradient as it is written; when a bucket's last
// gradient arrives its all-reduce (sum) starts on the CommWorker thread while backward goes
// on (on GPU ranks the NCCL all-reduce waits on the GPU, through an event, for the backward
// work that wrote the bucket). finish() waits for every bucket. Optional fp16/bf16
// compression all-reduces 16-bit copies (pre-divided by the world size so fp16 cannot
// overflow on the sum).
// Control values (the ranks' stop flags) ride along with the last bucket: the gradient tail
// slots after the flat buffer are summed with it, so agreeing costs no extra round trip.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "comm/comm_worker.h"
#include "engine/model.h"

namespace spotrain {

struct ReducerOptions {
  double bucket_mb = 25;
  double first_bucket_mb = 1;
  std::string compression = "none";  // none | fp16 | bf16
};

class Reducer final : public GradListener {
 public:
  Reducer(Model& model, CommWorker& worker, const ReducerOptions& opt);
  // Called by backward for each parameter whose gradient is complete.
  void grad_ready(const Param& p) override;
  // Launches any bucket not launched yet, then waits for all; the flat gradients then hold
  // the SUM over ranks. Returns the seconds spent waiting (exposed communication).
  double finish();
  size_t num_buckets() const { return buckets_.size(); }
  // Control value i (< Model::kGradTail) for this step: set before backward (it is reset
  // to 0 after each step); after finish() control(i) is the sum over ranks. Values should be
  // small counts (0/1 flags): with gradient compression they travel as fp16/bf16.
  void set_control(int i, float value);
  float control(int i);

 private:
  struct Bucket {
    int64_t begin = 0, end = 0;  // element range of the flat buffer
    int params = 0, ready = 0;
    bool launched = false;
    uint64_t ticket = 0;
  };
  void launch(Bucket& b);

  Model& model_;
  CommWorker& worker_;
  ReducerOptions opt_;
  std::vector<Bucket> buckets_;
  std::vector<int> bucket_of_param_;  // by Model::params() index
  std::vector<uint16_t> scratch_;     // compression buffer
  int64_t tail_bucket_ = -1;          // the bucket ending at the flat buffer's end
  float control_[Model::kGradTail] = {0, 0, 0, 0};  // this rank's values for the next step
  float summed_[Model::kGradTail] = {0, 0, 0, 0};   // the last step's sums over ranks
};

}  // namespace spotrain
