// Reducer (see reducer.h).
#include "comm/reducer.h"

#include <algorithm>
#include <chrono>

#include "engine/error.h"
#include "kernels/elementwise.h"

namespace spotrain {

Reducer::Reducer(Model& model, CommWorker& worker, const ReducerOptions& opt)
    : model_(model), worker_(worker), opt_(opt) {
  SPOTRAIN_CHECK(opt.bucket_mb > 0, "--bucket-mb must be positive");
  SPOTRAIN_CHECK(opt.compression == "none" || opt.compression == "fp16" || opt.compression == "bf16",
                 "unknown --grad-compression '", opt.compression, "'; use none, fp16 or bf16");
  SPOTRAIN_CHECK(model.flat_grads().device() == Device::cpu || opt.compression == "none",
                 "--grad-compression is implemented for host buffers only");
  SPOTRAIN_CHECK(model.flat_grads().device() == Device::cpu || worker.comm().size() == 1 ||
                     worker.comm().device_buffers(),
                 "internal: GPU gradients need a device communicator (NCCL), got ",
                 worker.comm().name());
  // Parameters sorted by flat offset (reverse layer order) fill buckets front to back.
  const auto& params = model.params();
  std::vector<std::pair<int64_t, int>> order;
  for (size_t i = 0; i < params.size(); ++i) order.emplace_back(model.offset_of(params[i]), int(i));
  std::sort(order.begin(), order.end());
  bucket_of_param_.assign(params.size(), -1);
  // The first bucket is the smaller of --bucket-mb and first_bucket_mb.
  int64_t limit = int64_t(std::min(opt.first_bucket_mb, opt.bucket_mb) * (1 << 20) / 4);
  for (auto& [off, idx] : order) {
    int64_t n = params[size_t(idx)]->value.numel();
    if (buckets_.empty() || buckets_.back().end - buckets_.back().begin >= limit) {
      if (!buckets_.empty()) limit = int64_t(opt.bucket_mb * (1 << 20) / 4);
      buckets_.push_back(Bucket{off, off, 0, 0, false, 0});
    }
    buckets_.back().end = off + n;
    buckets_.back().params++;
    bucket_of_param_[size_t(idx)] = int(buckets_.size() - 1);
  }
  SPOTRAIN_CHECK(!buckets_.empty(), "internal: a model without parameters");
  tail_bucket_ = int64_t(buckets_.size()) - 1;  // sorted by offset: the last ends at P
  int64_t biggest = 0;
  for (auto& b : buckets_) biggest = std::max(biggest, b.end - b.begin);
  if (opt.compression != "none") scratch_.resize(size_t(biggest + Model::kGradTail));
}

void Reducer::set_control(int i, float value) {
  SPOTRAIN_CHECK(i >= 0 && i < Model::kGradTail, "internal: control index ", i);
  control_[i] = value;
}

float Reducer::control(int i) {
  SPOTRAIN_CHECK(i >= 0 && i < Model::kGradTail, "internal: control index ", i);
  return summed_[i];
}

void Reducer::grad_ready(const Param& p) {
  const auto& params = model_.params();
  auto it = std::find(params.begin(), params.end(), &p);
  SPOTRAIN_CHECK(it != params.end(), "internal: gradient of unknown parameter ", p.name);
  Bucket& b = buckets_[size_t(bucket_of_param_[size_t(it - params.begin())])];
  if (++b.ready == b.params) launch(b);
}

void Reducer::launch(Bucket& b) {
  b.launched = true;
  float* g = model_.flat_grads().data<float>() + b.begin;
  int64_t n = b.end - b.begin;
  if (&b == &buckets_[size_t(tail_bucket_)]) {
    // The tail slots follow this bucket in memory: one all-reduce covers both.
    Backend& be = model_.backend();
    Tensor h = Tensor::host({Model::kGradTail});
    std::copy(control_, control_ + Model::kGradTail, h.data<float>());
    be.copy(be.from_host(h), model_.grad_tail());
    n += Model::kGradTail;
  }
  Communicator& comm = worker_.comm();
  std::string what = str("all-reduce of gradient bucket [", b.begin, ", ", b.end, ")");
  if (opt_.compression == "none") {
    // On NCCL the all-reduce waits (on the GPU) for the backward work queued so far, which
    // wrote this bucket; the training thread goes on queueing backward meanwhile.
    void* mark = comm.mark_compute();
    b.ticket = worker_.submit(what, [&comm, g, n, mark] { comm.allreduce_sum_after(mark, g, n, DType::f32); });
    return;
  }
  bool bf = opt_.compression == "bf16";
  uint16_t* s = scratch_.data();
  float world = float(comm.size());
  b.ticket = worker_.submit(what, [&comm, g, n, s, bf, world] {
    float inv = 1.f / world;
    for (int64_t i = 0; i < n; ++i) s[i] = bf ? float_to_bf16(g[i] * inv) : float_to_half(g[i] * inv);
    comm.allreduce_sum(s, n, bf ? DType::bf16 : DType::f16);
    for (int64_t i = 0; i < n; ++i) g[i] = (bf ? bf16_to_float(s[i]) : half_to_float(s[i])) * world;
  });
}

double Reducer::finish() {
  auto t0 = std::chrono::steady_clock::now();
  for (auto& b : buckets_)
    if (!b.launched) launch(b);  // parameters that took no gradient this step
  for (auto& b : buckets_) worker_.wait(b.ticket);
  Tensor h = model_.backend().to_host(model_.grad_tail());
  std::copy(h.data<float>(), h.data<float>() + Model::kGradTail, summed_);
  std::fill(control_, control_ + Model::kGradTail, 0.f);
  for (auto& b : buckets_) {
    b.ready = 0;
    b.launched = false;
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace spotrain
