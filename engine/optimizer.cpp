// Sgd (see optimizer.h): builds weight-decay segments (LARS: per-tensor segments) over the
// flat buffer, then one backend call per step.
#include "engine/optimizer.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace spotrain {

Sgd::Sgd(Model& model, const SgdOptions& opt) : model_(model), opt_(opt) {
  SPOTRAIN_CHECK(opt.momentum >= 0.f && opt.momentum < 1.f, "--momentum must be in [0, 1), got ",
                 opt.momentum);
  SPOTRAIN_CHECK(opt.weight_decay >= 0.f, "--weight-decay must not be negative, got ",
                 opt.weight_decay);
  SPOTRAIN_CHECK(!opt.nesterov || opt.momentum > 0.f, "--nesterov needs a positive --momentum");
  SPOTRAIN_CHECK(opt.kind == "sgd" || opt.kind == "lars", "unknown --optimizer '", opt.kind,
                 "'; use sgd or lars");
  SPOTRAIN_CHECK(opt.lars_trust > 0.f && std::isfinite(opt.lars_trust),
                 "--lars-trust must be a positive number, got ", opt.lars_trust);
  SPOTRAIN_CHECK(opt.lars_epsilon >= 0.f && std::isfinite(opt.lars_epsilon),
                 "--lars-epsilon must not be negative, got ", opt.lars_epsilon);
  momentum_ = model.backend().zeros({model.num_params()});
  // Segments in flat-buffer order, merging neighbours with the same decay.
  std::vector<std::pair<int64_t, const Param*>> order;
  for (auto* p : model.params()) order.emplace_back(model.offset_of(p), p);
  std::sort(order.begin(), order.end());
  for (auto& [off, p] : order) {
    float wd = (p->no_decay && !opt.decay_bn_and_bias) ? 0.f : opt.weight_decay;
    int64_t n = p->value.numel();
    if (!segments_.empty() && segments_.back().weight_decay == wd &&
        segments_.back().offset + segments_.back().count == off)
      segments_.back().count += n;
    else
      segments_.push_back(SgdSegment{off, n, wd});
    // LARS: an adapted tensor is a segment of its own (its own norms); the tensors left out
    // (BN, biases) merge with their neighbours.
    const bool adapt = !(p->no_decay && !opt.decay_bn_and_bias);
    if (!adapt && !lars_segments_.empty() && !lars_segments_.back().adapt &&
        lars_segments_.back().offset + lars_segments_.back().count == off)
      lars_segments_.back().count += n;
    else
      lars_segments_.push_back(LarsSegment{off, n, adapt ? opt.weight_decay : 0.f, adapt});
  }
}

void Sgd::step(float lr, float grad_scale, bool unless_overflow) {
  if (lars()) {
    LarsHyper h{lr, opt_.momentum, opt_.nesterov, grad_scale, unless_overflow, opt_.lars_trust,
                opt_.lars_epsilon};
    model_.backend().lars_step(model_.flat_params(), model_.flat_grads(), momentum_,
                               lars_segments_, h);
  } else {
    SgdHyper h{lr, opt_.momentum, opt_.nesterov, grad_scale, unless_overflow};
    model_.backend().sgd_step(model_.flat_params(), model_.flat_grads(), momentum_, segments_, h);
  }
  if (!unless_overflow) ++steps_;
}

}  // namespace spotrain
