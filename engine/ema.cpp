// WeightEma (see ema.h).
#include "engine/ema.h"

namespace spotrain {

WeightEma::WeightEma(Model& model, double decay) : model_(model), decay_(decay) {
  Backend& be = model.backend();
  params_ = Tensor(model.flat_params().shape(), DType::f32, be.allocator());
  for (auto* b : model.buffers()) buffers_.push_back(Tensor(b->value.shape(), b->value.dtype(), be.allocator()));
  restart();
}

void WeightEma::restart() {
  Backend& be = model_.backend();
  be.copy(model_.flat_params(), params_);
  for (size_t i = 0; i < buffers_.size(); ++i) be.copy(model_.buffers()[i]->value, buffers_[i]);
}

void WeightEma::update() {
  Backend& be = model_.backend();
  const float w = float(1.0 - decay_);
  be.lerp(params_, model_.flat_params(), w);
  for (size_t i = 0; i < buffers_.size(); ++i)
    if (buffers_[i].dtype() == DType::f32) be.lerp(buffers_[i], model_.buffers()[i]->value, w);
}

void WeightEma::swap() {
  Backend& be = model_.backend();
  auto exchange = [&](Tensor& a, Tensor& b) {
    Tensor tmp(a.shape(), a.dtype(), be.allocator(), a.layout());
    be.copy(a, tmp);
    be.copy(b, a);  // copy marks its destination written: the model's cached copies refresh
    be.copy(tmp, b);
  };
  exchange(model_.flat_params(), params_);
  for (size_t i = 0; i < buffers_.size(); ++i) exchange(model_.buffers()[i]->value, buffers_[i]);
  swapped_ = !swapped_;
}

}  // namespace spotrain
