// Model (see model.h): flat parameter buffers and initialization.
#include "engine/model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>
#include <vector>

#include "core/error.h"
#include "core/philox.h"

namespace spotrain {

Model::Model(std::unique_ptr<Layer> net, Backend& be) : net_(std::move(net)), be_(be) {
  net_->collect_params(params_);
  net_->collect_buffers(buffers_);
  int64_t total = 0;
  for (auto* p : params_) {
    SPOTRAIN_CHECK(by_name_.emplace(p->name, p).second, "duplicate parameter name ", p->name);
    index_[p] = index_.size();
    total += p->value.numel();
  }
  // Reverse layer order: the last layer's parameters sit at offset 0.
  Tensor host_params = Tensor::host({total});
  int64_t off = 0;
  for (auto it = params_.rbegin(); it != params_.rend(); ++it) {
    Param* p = *it;
    offsets_[p] = off;
    std::memcpy(host_params.data<float>() + off, p->value.raw(), p->value.nbytes());
    off += p->value.numel();
  }
  flat_params_ = be_.from_host(host_params);
  grads_and_tail_ = be_.zeros({total + kGradTail});
  flat_grads_ = Tensor::view(grads_and_tail_, 0, {total});
  grad_tail_ = Tensor::view(grads_and_tail_, total, {kGradTail});
  for (auto* p : params_) {
    int64_t o = offsets_[p];
    p->value = Tensor::view(flat_params_, o, p->value.shape());
    p->grad = Tensor::view(flat_grads_, o, p->grad.shape());
  }
  int64_t nb = 0;
  for (auto* b : buffers_) {
    SPOTRAIN_CHECK(b->value.dtype() == DType::f32, "internal: buffer ", b->name, " is not fp32");
    buffer_offsets_[b] = nb;
    nb += (b->value.numel() + 15) / 16 * 16;  // 64-byte aligned starts
  }
  Tensor host_buffers = Tensor::host({std::max<int64_t>(nb, 1)});
  std::memset(host_buffers.raw(), 0, host_buffers.nbytes());
  for (auto* b : buffers_)
    std::memcpy(host_buffers.data<float>() + buffer_offsets_[b], b->value.raw(), b->value.nbytes());
  flat_buffers_ = be_.from_host(host_buffers);
  for (auto* b : buffers_) b->value = Tensor::view(flat_buffers_, buffer_offsets_[b], b->value.shape());
}

Param* Model::find_param(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : it->second;
}

Buffer* Model::find_buffer(const std::string& name) const {
  for (auto* b : buffers_)
    if (b->name == name) return b;
  return nullptr;
}

int64_t Model::offset_of(const Param* p) const { return offsets_.at(p); }
size_t Model::index_of(const Param* p) const { return index_.at(p); }

// Each parameter draws from its own stream (seed, its index): a normal takes 2 words, a
// uniform 1, so a chunk starting at a multiple of 4 elements starts at a known block. The
// chunks are drawn in parallel; the values do not depend on the thread count.
void Model::initialize(uint64_t seed) {
  Tensor host = Tensor::host({num_params()});
  float* h = host.data<float>();
  constexpr int64_t kChunk = int64_t(1) << 16;  // elements, a multiple of 4
  struct Chunk {
    size_t param;
    int64_t begin, end;
  };
  std::vector<Chunk> chunks;
  for (size_t i = 0; i < params_.size(); ++i)
    for (int64_t b = 0, n = params_[i]->value.numel(); b < n; b += kChunk)
      chunks.push_back({i, b, std::min(n, b + kChunk)});
#pragma omp parallel for schedule(dynamic)
  for (int64_t c = 0; c < int64_t(chunks.size()); ++c) {
    const Chunk& k = chunks[size_t(c)];
    Param* p = params_[k.param];
    float* v = h + offsets_.at(p);
    Philox rng(seed, uint32_t(k.param), 0x1417u);
    switch (p->init) {
      case Param::Init::kaiming_fan_out: {
        rng.seek(uint32_t(k.begin / 2));
        const float std = std::sqrt(2.f / float(p->fan));
        for (int64_t j = k.begin; j < k.end; ++j) v[j] = rng.normal() * std;
        break;
      }
      case Param::Init::uniform_fan_in: {
        rng.seek(uint32_t(k.begin / 4));
        const float bound = 1.f / std::sqrt(float(p->fan));
        for (int64_t j = k.begin; j < k.end; ++j) v[j] = (2.f * rng.uniform() - 1.f) * bound;
        break;
      }
      case Param::Init::ones:
        std::fill(v + k.begin, v + k.end, 1.f);
        break;
      case Param::Init::zeros:
        std::fill(v + k.begin, v + k.end, 0.f);
        break;
    }
  }
  Tensor dev = be_.from_host(host);
  be_.copy(dev, flat_params_);
}

Tensor Model::forward(const Tensor& x, bool training, bool update_running) {
  Context ctx{be_, training, false};
  ctx.update_running = update_running;
  return net_->forward(x, ctx);
}

Tensor Model::forward_probed(const Tensor& x,
                             const std::function<void(Layer&, const Tensor&)>& probe) {
  Context ctx{be_, /*training=*/true, /*replay=*/false};
  ctx.scratch();
  ctx.probe = probe;
  try {
    Tensor y = net_->forward(x, ctx);
    net_->clear_stash();
    return y;
  } catch (...) {
    net_->clear_stash();
    throw;
  }
}

void Model::backward(const Tensor& dlogits, GradListener* listener) {
  Context ctx{be_, true, false, listener};
  net_->backward(dlogits, ctx);
}

std::string Model::summary() const {
  std::ostringstream os;
  int64_t n = 0;
  for (auto* p : params_) n += p->value.numel();
  os << params_.size() << " parameter tensors, " << n << " parameters ("
     << double(n) * 4 / (1 << 20) << " MiB fp32)";
  return os.str();
}

}  // namespace spotrain
