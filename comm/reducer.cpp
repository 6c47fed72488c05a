// Reducer (see reducer.h).
#include "comm/reducer.h"

#include <algorithm>
#include "core/clock.h"
#include "core/error.h"
#include "core/half.h"

namespace spotrain {

Reducer::Reducer(Tensor grads, int64_t tail, std::vector<GradRange> ranges, CommWorker& worker,
                 const ReducerOptions& opt)
    : grads_(std::move(grads)), tail_(tail), worker_(worker), opt_(opt) {
  SPOTRAIN_CHECK(opt.bucket_mb > 0, "--bucket-mb must be positive");
  SPOTRAIN_CHECK(opt.compression == "none" || opt.compression == "fp16" || opt.compression == "bf16",
                 "unknown --grad-compression '", opt.compression, "'; use none, fp16 or bf16");
  SPOTRAIN_CHECK(grads_.device() == Device::cpu || opt.compression == "none",
                 "--grad-compression is implemented for host buffers only");
  SPOTRAIN_CHECK(grads_.device() == Device::cpu || worker.comm().size() == 1 ||
                     worker.comm().device_buffers(),
                 "internal: GPU gradients need a device communicator (NCCL), got ",
                 worker.comm().name());
  SPOTRAIN_CHECK(grads_.dtype() == DType::f32 && tail_ >= 0,
                 "internal: the reducer takes fp32 gradients");
  // Parameters sorted by flat offset (reverse layer order) fill buckets front to back.
  std::vector<std::pair<int64_t, size_t>> order;
  for (size_t i = 0; i < ranges.size(); ++i) order.emplace_back(ranges[i].offset, i);
  std::sort(order.begin(), order.end());
  bucket_of_param_.assign(ranges.size(), -1);
  // The first bucket is the smaller of --bucket-mb and first_bucket_mb.
  int64_t limit = int64_t(std::min(opt.first_bucket_mb, opt.bucket_mb) * (1 << 20) / 4);
  for (auto& [off, idx] : order) {
    int64_t n = ranges[idx].count;
    if (buckets_.empty() || buckets_.back().end - buckets_.back().begin >= limit) {
      if (!buckets_.empty()) limit = int64_t(opt.bucket_mb * (1 << 20) / 4);
      buckets_.push_back(Bucket{off, off, 0, 0, false, 0});
    }
    buckets_.back().end = off + n;
    buckets_.back().params++;
    bucket_of_param_[idx] = int(buckets_.size() - 1);
  }
  SPOTRAIN_CHECK(!buckets_.empty(), "internal: a model without parameters");
  SPOTRAIN_CHECK(buckets_.back().end + tail_ == grads_.numel(),
                 "internal: the gradient ranges do not end where the control slots begin");
  tail_bucket_ = int64_t(buckets_.size()) - 1;  // sorted by offset: the last ends at P
  int64_t biggest = 0;
  for (auto& b : buckets_) biggest = std::max(biggest, b.end - b.begin);
  if (opt.compression != "none") scratch_.resize(size_t(biggest + tail_));
}

void Reducer::grad_ready(size_t param) {
  SPOTRAIN_CHECK(param < bucket_of_param_.size(), "internal: gradient of unknown parameter ", param);
  Bucket& b = buckets_[size_t(bucket_of_param_[param])];
  if (++b.ready == b.params) launch(b);
}

void Reducer::launch(Bucket& b) {
  b.launched = true;
  float* g = grads_.data<float>() + b.begin;
  int64_t n = b.end - b.begin;
  // The tail slots follow the last bucket in memory: one all-reduce covers both.
  if (&b == &buckets_[size_t(tail_bucket_)]) n += tail_;
  Communicator& comm = worker_.comm();
  std::string what = str("all-reduce of gradient bucket [", b.begin, ", ", b.end, ")");
  if (opt_.compression == "none") {
    // On NCCL the all-reduce waits (on the GPU) for the backward work queued so far, which
    // wrote this bucket; the training thread goes on queueing backward meanwhile.
    DeviceEvent* mark = comm.mark_compute();
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
  double t0 = now_seconds();
  for (auto& b : buckets_)
    if (!b.launched) launch(b);  // parameters that took no gradient this step
  for (auto& b : buckets_) worker_.wait(b.ticket);
  grads_.mark_written();
  for (auto& b : buckets_) {
    b.ready = 0;
    b.launched = false;
  }
  return now_seconds() - t0;
}

}  // namespace spotrain
