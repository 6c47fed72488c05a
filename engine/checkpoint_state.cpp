// Model and optimizer state to and from checkpoints (see checkpoint_state.h).
#include "engine/checkpoint_state.h"

#include <algorithm>

#include <functional>
#include <map>
#include <vector>

#include "core/error.h"
#include "layers/resnet.h"

namespace spotrain {

CheckpointInfo checkpoint_record(const RunIdentity& run, const TrainPosition& at,
                                 const LossScalerState& scaler) {
  CheckpointInfo info;
  info.config_json = run.config_json;
  info.model = run.model;
  info.precision = run.precision;
  info.seed = run.seed;
  info.num_classes = run.num_classes;
  info.in_channels = run.in_channels;
  info.global_batch = run.global_batch;
  info.world_size = run.world;
  info.epoch = at.epoch;
  info.batch_in_epoch = at.batch_in_epoch;
  info.global_step = at.step;
  info.samples_in_epoch = at.batch_in_epoch * run.global_batch;
  info.scaler = scaler;
  return info;
}

TrainPosition position_of(const CheckpointInfo& info) {
  return TrainPosition{info.global_step, info.epoch, info.batch_in_epoch};
}

TrainPosition settled(const TrainPosition& at, int64_t batches_per_epoch) {
  if (batches_per_epoch > 0 && at.batch_in_epoch >= batches_per_epoch)
    return TrainPosition{at.step, at.epoch + 1, 0};
  return at;
}

std::string progress_text(const TrainPosition& at) {
  std::string s = str(at.epoch, at.epoch == 1 ? " epoch" : " epochs");
  if (at.batch_in_epoch > 0)
    s += str(" and ", at.batch_in_epoch, at.batch_in_epoch == 1 ? " batch" : " batches");
  return s + " done";
}

CheckpointSnapshot snapshot_checkpoint(Model& model, Sgd* sgd, const CheckpointInfo& info,
                                       Tensor* params_buf, Tensor* momentum_buf,
                                       const Tensor* bn_stats) {
  Backend& be = model.backend();
  CheckpointSnapshot s;
  s.info = info;
  // The BN buffers first (small, copied at once), then one host copy of each flat buffer,
  // queued without waiting where the backend can; the per-parameter tensors are views.
  const Tensor stats = be.to_host(bn_stats ? *bn_stats : model.flat_buffers());
  NamedTensors buffers;
  for (auto* b : model.buffers())
    buffers.emplace_back(b->name, Tensor::view(stats, model.buffer_offset(b), b->value.shape()));
  std::vector<std::function<void()>> waits;
  auto host_copy = [&](const Tensor& src, Tensor* buf) {
    if (!buf) return be.to_host(src);  // to_host always copies
    waits.push_back(be.copy_to_host_async(src, *buf));
    return *buf;
  };
  Tensor params = host_copy(model.flat_params(), params_buf);
  for (auto* p : model.params())
    s.model.emplace_back(p->name, Tensor::view(params, model.offset_of(p), p->value.shape()));
  for (auto& b : buffers) s.model.push_back(std::move(b));
  if (sgd) {
    Tensor m = host_copy(sgd->momentum(), momentum_buf);
    for (auto* p : model.params())
      s.momentum.emplace_back(p->name, Tensor::view(m, model.offset_of(p), p->value.shape()));
    static_cast<OptimizerSettings&>(s.optimizer) = sgd->options();
    s.optimizer.steps = sgd->steps();
  }
  s.wait_copies = [waits] {
    for (auto& w : waits) w();
  };
  return s;
}

int64_t checkpoint_bytes(const Model& model, bool with_momentum) {
  int64_t n = model.num_params() * (with_momentum ? 2 : 1);  // an --ema-decay average adds one more
  for (auto* b : model.buffers()) n += b->value.numel();
  return checkpoint_bytes(n);
}

namespace {

// Host views, named per parameter, into one host buffer laid out as the flat parameters.
NamedTensors flat_views(const Model& model, const Tensor& host_flat) {
  NamedTensors out;
  for (auto* p : model.params())
    out.emplace_back(p->name, Tensor::view(host_flat, model.offset_of(p), p->value.shape()));
  return out;
}

}  // namespace

namespace {

// A group of model-named tensors ("model" or "ema") copied into a flat parameter buffer and
// one tensor per BN buffer on the device.
void load_group(const std::string& path, Model& model, const std::string& group, Tensor& flat_params,
                const std::vector<Tensor*>& buffers) {
  Backend& be = model.backend();
  Tensor flat = Tensor::host({model.num_params()});
  NamedTensors params = flat_views(model, flat);
  read_checkpoint_tensors(path, group, params);
  NamedTensors host;
  for (auto* b : model.buffers()) host.emplace_back(b->name, Tensor::host(b->value.shape()));
  read_checkpoint_tensors(path, group, host);
  be.copy(be.from_host(flat), flat_params);  // marks the weights written
  for (size_t i = 0; i < host.size(); ++i) be.copy(be.from_host(host[i].second), *buffers[i]);
}

}  // namespace

void load_checkpoint_weights(const std::string& path, Model& model, const std::string& group) {
  std::vector<Tensor*> buffers;
  for (auto* b : model.buffers()) buffers.push_back(&b->value);
  load_group(path, model, group, model.flat_params(), buffers);
}

MatchedWeights load_matching_weights(const std::string& path, Model& model) {
  MatchedWeights m;
  m.model = read_checkpoint_info(path).model;
  std::map<std::string, Shape> held = checkpoint_tensor_shapes(path, "model");
  // Whether the file's tensor `name` fits `shape`; takes it off the list of unused ones.
  auto take = [&](const std::string& name, const Shape& shape) {
    auto it = held.find(name);
    if (it == held.end()) {
      m.skipped.push_back(name + " (not in the file)");
      return false;
    }
    const bool fits = it->second == shape;
    if (!fits)
      m.skipped.push_back(str(name, " (shape ", shape_str(it->second), " there, ", shape_str(shape), " here)"));
    held.erase(it);
    return fits;
  };
  Backend& be = model.backend();
  Tensor flat = be.to_host(model.flat_params());  // a copy: the tensors not taken keep their values
  NamedTensors taken;  // views into `flat` for the parameters, then one tensor per BN buffer
  for (auto* p : model.params())
    if (take(p->name, p->value.shape()))
      taken.emplace_back(p->name, Tensor::view(flat, model.offset_of(p), p->value.shape()));
  const size_t params = taken.size();
  std::vector<Tensor*> buffers;
  for (auto* b : model.buffers())
    if (take(b->name, b->value.shape())) {
      taken.emplace_back(b->name, Tensor::host(b->value.shape()));
      buffers.push_back(&b->value);
    }
  for (const auto& [name, shape] : held) m.unused.push_back(name);
  m.loaded = int(taken.size());
  SPOTRAIN_CHECK(m.loaded > 0, "--init-from ", path, ": none of its tensors (a ", m.model,
                 ") has a name and shape of this model's");
  read_checkpoint_tensors(path, "model", taken);
  be.copy(be.from_host(flat), model.flat_params());  // marks the weights written
  for (size_t i = 0; i < buffers.size(); ++i) be.copy(be.from_host(taken[params + i].second), *buffers[i]);
  return m;
}

NamedTensors ema_snapshot(Model& model, WeightEma& ema) {
  Backend& be = model.backend();
  NamedTensors out = flat_views(model, be.to_host(ema.params()));
  for (size_t i = 0; i < model.buffers().size(); ++i)
    out.emplace_back(model.buffers()[i]->name, be.to_host(ema.buffers()[i]));
  return out;
}

void load_ema(const std::string& path, Model& model, WeightEma& ema) {
  std::vector<Tensor*> buffers;
  for (Tensor& b : ema.buffers()) buffers.push_back(&b);
  load_group(path, model, "ema", ema.params(), buffers);
}

CheckpointInfo load_training_state(const std::string& path, Model& model, Sgd& sgd) {
  CheckpointInfo info = read_checkpoint_info(path);
  load_checkpoint_weights(path, model);
  SPOTRAIN_CHECK(info.optimizer_steps >= 0, "checkpoint ", path,
                 " has no optimizer state; it cannot resume training");
  Backend& be = model.backend();
  Tensor flat = Tensor::host({model.num_params()});
  NamedTensors momentum = flat_views(model, flat);
  read_checkpoint_tensors(path, "optimizer/momentum", momentum);
  be.copy(be.from_host(flat), sgd.momentum());
  sgd.set_steps(info.optimizer_steps);
  return info;
}

namespace {
// "" when the model a checkpoint records is one this build makes, else why not.
std::string recorded_model_problem(const CheckpointInfo& info) {
  const auto names = resnet_arch_names();
  if (std::find(names.begin(), names.end(), info.model) != names.end()) return "";
  std::string known;
  for (const auto& n : names) known += (known.empty() ? "" : ", ") + n;
  return str("the model it records, '", info.model, "', is not one this build knows (", known,
             "): written by another version, or damaged?");
}
}  // namespace

void check_recorded_model(const std::string& path, const CheckpointInfo& info) {
  const std::string why = recorded_model_problem(info);
  SPOTRAIN_CHECK(why.empty(), "checkpoint ", path, ": ", why);
}

ExpectTensors checkpoint_expectation(bool need_optimizer) {
  return [need_optimizer](const CheckpointInfo& info) {
    const std::string why = recorded_model_problem(info);  // verify_checkpoint names the file
    SPOTRAIN_CHECK(why.empty(), why);
    ResNetOptions ro;
    ro.arch = info.model;
    ro.num_classes = info.num_classes;
    ro.in_channels = info.in_channels;
    const auto net = build_resnet(ro);
    std::vector<Param*> params;
    std::vector<Buffer*> buffers;
    net->collect_params(params);
    net->collect_buffers(buffers);
    ExpectedTensors e;
    e.need_optimizer = need_optimizer;
    for (Param* p : params) {
      e.model.emplace_back(p->name, p->value.shape());
      e.momentum.emplace_back(p->name, p->value.shape());
    }
    for (Buffer* b : buffers) e.model.emplace_back(b->name, b->value.shape());
    return e;
  };
}

}  // namespace spotrain
