// The layer contract. A layer's public forward()/backward() validate their input and call
// forward_impl()/backward_impl(); what backward needs is stashed explicitly in members, so
// gradient checkpointing can drop the stash (clear_stash) and replay forward later.
// Gradients: parameter gradients are OVERWRITTEN by backward (every parameter is used once
// per backward pass, so no zeroing pass is needed); the input gradient is returned as a new
// tensor. With gradient accumulation (--accum-steps K) a step is K backward passes, and the
// rule still holds for each: a layer never adds. The sum over the micro-batches is the step
// runner's (engine/model.h says how), so no layer and no backend kernel knows of it.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "kernels/ops.h"

namespace spotrain {

// A trainable tensor with its torchvision name. Once a Model holds it, value and grad are
// views into the model's flat parameter and gradient buffers.
struct Param {
  // How Model::initialize fills the value (torchvision's ResNet initialization).
  enum class Init { kaiming_fan_out, uniform_fan_in, ones, zeros };
  std::string name;
  Init init = Init::zeros;
  int64_t fan = 1;  // fan_out for kaiming, fan_in for uniform
  Tensor value;  // fp32 master copy, canonical layout (conv OIHW)
  Tensor grad;   // same shape
  bool no_decay = false;  // BN scale/shift and biases (excluded from weight decay on request)
};

// A non-trainable tensor saved in checkpoints (BN running statistics).
struct Buffer {
  std::string name;
  Tensor value;
};

// Told when a parameter's gradient is complete during backward (the all-reduce Reducer
// starts a bucket's communication as soon as its last gradient arrives).
class GradListener {
 public:
  virtual ~GradListener() = default;
  virtual void grad_ready(const Param& p) = 0;
};

class Layer;

// What a pass needs besides its input: the backend and the mode.
struct Context {
  Backend& be;
  bool training = true;
  // Re-running forward for gradient checkpointing: a convolution's kept output is taken back.
  bool replay = false;
  GradListener* listener = nullptr;
  // Told each layer and its input before the layer's forward (engine/fusion_choice.cpp times
  // the fused chains on the inputs a scratch training forward meets).
  std::function<void(Layer&, const Tensor&)> probe = nullptr;
  void grad_ready(const Param& p) {
    if (listener) listener->grad_ready(p);
  }
  // The model's state a pass changes besides each layer's stash for backward; each pass that
  // must leave it alone says so here, and the layers ask nothing else:
  // - update_running: batch norm updates its running statistics. Not in a replay (counted
  //   once already), a scratch pass, or a step's micro-batches after its first (K ranks evaluate
  //   with rank 0's statistics, updated once a step from its batch, and micro-batch 0 of a rank
  //   with K micro-batches is what rank 0 of K ranks would see).
  // - keep_outputs: a convolution keeps its output for a replay (selective checkpointing). Not
  //   in a replay or a scratch pass.
  bool update_running = true;
  bool keep_outputs = true;
  // A training pass whose results are thrown away (--fusion auto's probe and its timing runs):
  // it computes as training does, but leaves the model as it was.
  void scratch() {
    update_running = false;
    keep_outputs = false;
  }
  // A checkpoint replay (layers/containers.cpp): kept outputs taken back, the model left as it is
  // (its statistics were counted, its outputs kept, by the forward being replayed).
  void as_replay() {
    replay = true;
    scratch();
  }
};

class Layer {
 public:
  explicit Layer(std::string name) : name_(std::move(name)) {}
  virtual ~Layer() = default;
  Layer(const Layer&) = delete;
  Layer& operator=(const Layer&) = delete;

  Tensor forward(const Tensor& x, Context& ctx);
  // Returns the gradient of the input, or an empty Tensor when the input needs none.
  Tensor backward(const Tensor& dy, Context& ctx);

  virtual void collect_params(std::vector<Param*>& out) { (void)out; }
  virtual void collect_buffers(std::vector<Buffer*>& out) { (void)out; }
  // Calls f on this layer and, in a container, on every layer inside it.
  virtual void visit(const std::function<void(Layer&)>& f) { f(*this); }
  virtual void clear_stash() {}
  // What a Checkpointed segment calls after its forward: as clear_stash, except that a layer
  // asked to keep its output for the replay (Conv2d under --grad-checkpoint selective) does.
  virtual void clear_stash_for_replay() { clear_stash(); }
  // The model's first layer: its input (the image) takes no gradient.
  virtual void set_needs_input_grad(bool v) { needs_input_grad_ = v; }
  bool needs_input_grad() const { return needs_input_grad_; }
  const std::string& name() const { return name_; }
  virtual std::string kind() const = 0;

 protected:
  virtual void validate(const Tensor& x) const { (void)x; }
  virtual Tensor forward_impl(const Tensor& x, Context& ctx) = 0;
  virtual Tensor backward_impl(const Tensor& dy, Context& ctx) = 0;
  std::string name_;
  bool needs_input_grad_ = true;

 private:
  // What this layer's passes allocate under ("Conv2d forward"), named at the first pass.
  AllocScope::Name forward_scope_{nullptr}, backward_scope_{nullptr};
};

// Joins a prefix and a name the torchvision way: "layer1.0" + "conv1".
inline std::string join_name(const std::string& prefix, const std::string& n) {
  return prefix.empty() ? n : prefix + "." + n;
}

}  // namespace spotrain
