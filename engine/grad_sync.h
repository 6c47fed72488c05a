// Data-parallel gradient sync for one model: the comm/ Reducer over the model's flat
// gradients, told by backward which parameter is done, plus the ranks' control values
// (stop flags) that ride in the slots after the gradients with the last bucket.
#pragma once
#include <memory>

#include "comm/reducer.h"
#include "engine/model.h"

namespace spotrain {

// The control slots the run uses: the stop flag (run/stop_policy.h), and rank 0's word that a
// checkpoint is due after this step where several ranks write copies (run/run_checkpoints.h).
constexpr int kStopSlot = 0, kCheckpointSlot = 1;

class GradSync final : public GradListener {
 public:
  GradSync(Model& model, CommWorker& worker, const ReducerOptions& opt);
  void grad_ready(const Param& p) override;
  // Waits for every bucket (launching those that took no gradient); the flat gradients then
  // hold the sum over ranks and control(i) the control values' sums. Returns the seconds waited.
  double finish();
  // Control value i (< Model::kGradTail) for the next step; reset to 0 after each step.
  // Values should be small counts (0/1 flags): with compression they travel as fp16/bf16.
  void set_control(int i, float value);
  float control(int i) const;
  size_t num_buckets() const { return reducer_->num_buckets(); }
  // The ranks' collective worker, for the few agreements made outside the gradient buckets
  // (--fusion auto's verdicts: choose_fusion).
  CommWorker& worker() { return worker_; }

 private:
  void write_tail();
  Model& model_;
  CommWorker& worker_;
  std::unique_ptr<Reducer> reducer_;
  bool tail_written_ = false;  // this step's control values are in the buffer
  float control_[Model::kGradTail] = {0, 0, 0, 0};  // this rank's values for the next step
  float summed_[Model::kGradTail] = {0, 0, 0, 0};   // the last step's sums over ranks
};

}  // namespace spotrain
