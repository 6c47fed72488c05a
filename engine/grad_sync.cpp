// GradSync (see grad_sync.h).
#include "engine/grad_sync.h"

#include <algorithm>

#include "core/error.h"

namespace spotrain {

namespace {
std::vector<GradRange> ranges_of(const Model& m) {
  std::vector<GradRange> r;
  for (auto* p : m.params()) r.push_back(GradRange{m.offset_of(p), p->value.numel()});
  return r;
}
}  // namespace

GradSync::GradSync(Model& model, CommWorker& worker, const ReducerOptions& opt)
    : model_(model),
      worker_(worker),
      reducer_(std::make_unique<Reducer>(model.grads_and_tail(), Model::kGradTail,
                                         ranges_of(model), worker, opt)) {}

// This step's control values into the slots, before the last bucket (which carries them)
// is launched: at the first gradient of the step.
void GradSync::write_tail() {
  if (tail_written_) return;
  Backend& be = model_.backend();
  Tensor h = Tensor::host({Model::kGradTail});
  std::copy(control_, control_ + Model::kGradTail, h.data<float>());
  be.copy(be.from_host(h), model_.grad_tail());
  tail_written_ = true;
}

void GradSync::grad_ready(const Param& p) {
  write_tail();
  reducer_->grad_ready(model_.index_of(&p));
}

double GradSync::finish() {
  write_tail();
  double waited = reducer_->finish();
  Tensor h = model_.backend().to_host(model_.grad_tail());
  std::copy(h.data<float>(), h.data<float>() + Model::kGradTail, summed_);
  std::fill(control_, control_ + Model::kGradTail, 0.f);
  tail_written_ = false;
  return waited;
}

void GradSync::set_control(int i, float value) {
  SPOTRAIN_CHECK(i >= 0 && i < Model::kGradTail, "internal: control index ", i);
  control_[i] = value;
}

float GradSync::control(int i) const {
  SPOTRAIN_CHECK(i >= 0 && i < Model::kGradTail, "internal: control index ", i);
  return summed_[i];
}

}  // namespace spotrain
