// Model: a layer graph plus its parameters laid out in one flat fp32 buffer (and one flat
// gradient buffer) in REVERSE layer order, so the optimizer, the all-reduce buckets and
// checkpoints all see one array and the last layer's gradients come first. The BN buffers
// (running statistics) are views into one flat buffer too: one copy or broadcast moves them all.
#pragma once
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "layers/layer.h"

namespace spotrain {

class Model {
 public:
  // Takes the graph; moves every parameter into flat buffers on the backend's device.
  Model(std::unique_ptr<Layer> net, Backend& be);
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  // Fills parameters the torchvision way (Kaiming normal fan-out for convolutions, uniform
  // +-1/sqrt(fan_in) for Linear, ones/zeros for BN), drawn from Philox(seed, param index).
  void initialize(uint64_t seed);

  // update_running false: batch norm keeps its running statistics (Context::update_running).
  Tensor forward(const Tensor& x, bool training, bool update_running = true);
  // A training forward whose results are thrown away (Context::scratch: the running
  // statistics stay as they were, and the stash is dropped at its end, a throw included) that
  // tells `probe` each layer and its input before the layer runs: the activations a training
  // step meets (--fusion auto times its chains on them).
  Tensor forward_probed(const Tensor& x, const std::function<void(Layer&, const Tensor&)>& probe);
  // Fills every parameter's gradient (overwriting), telling `listener` as each completes.
  // Gradient accumulation over K micro-batches (StepRunner, --accum-steps) keeps this rule:
  // the first K-1 backward passes run without a listener, and after each the runner adds
  // flat_grads into a sum of its own (P fp32, the micro-batches in order); the last pass
  // overwrites flat_grads as always, and as it reports each parameter complete the runner adds
  // that parameter's part of the sum into it (the last micro-batch's gradient + the sum of the
  // others) before passing it on to the all-reduce. flat_grads then holds the sum over the K
  // micro-batches, which the step scales by 1 / (ranks x K) as one rank's sum is by 1 / ranks.
  void backward(const Tensor& dlogits, GradListener* listener = nullptr);
  void clear_stash() { net_->clear_stash(); }

  Layer& net() { return *net_; }
  Backend& backend() { return be_; }
  const std::vector<Param*>& params() const { return params_; }     // forward order
  const std::vector<Buffer*>& buffers() const { return buffers_; }  // forward order
  Param* find_param(const std::string& name) const;
  Buffer* find_buffer(const std::string& name) const;
  Tensor& flat_params() { return flat_params_; }  // (P) fp32
  Tensor& flat_grads() { return flat_grads_; }    // (P) fp32
  // kGradTail fp32 slots right after the flat gradients, in the same storage: the Reducer
  // sums its control values (the stop flag) across ranks with the last gradient bucket.
  static constexpr int64_t kGradTail = 4;
  Tensor& grad_tail() { return grad_tail_; }
  Tensor& grads_and_tail() { return grads_and_tail_; }  // (P + kGradTail), one storage
  int64_t num_params() const { return flat_params_.numel(); }
  // Offset of a parameter in the flat buffers, and its index in params().
  int64_t offset_of(const Param* p) const;
  size_t index_of(const Param* p) const;
  // (B) fp32: every BN buffer, in forward order, each starting on a 64-byte boundary (zeros
  // between); buffer_offset(b) says where.
  Tensor& flat_buffers() { return flat_buffers_; }
  int64_t buffer_offset(const Buffer* b) const { return buffer_offsets_.at(b); }
  // One line per layer with parameter counts.
  std::string summary() const;

 private:
  std::unique_ptr<Layer> net_;
  Backend& be_;
  std::vector<Param*> params_;
  std::vector<Buffer*> buffers_;
  std::map<std::string, Param*> by_name_;
  std::map<const Param*, int64_t> offsets_;
  std::map<const Param*, size_t> index_;
  std::map<const Buffer*, int64_t> buffer_offsets_;
  Tensor flat_params_, flat_grads_, grad_tail_, grads_and_tail_, flat_buffers_;
};

}  // namespace spotrain
