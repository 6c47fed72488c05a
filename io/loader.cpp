// Threaded loader (see loader.h). Each batch is one task: a worker takes the next batch
// index inside the prefetch window, fills it, and files it under its index; next() hands the
// batches out in index order. start_epoch bumps a generation so stale work is dropped.
#include "io/loader.h"

#include <algorithm>
#include <cstring>

#include "engine/error.h"

namespace spotrain {
namespace io {
namespace {

int64_t checked_size(const std::shared_ptr<const Dataset>& data) {
  SPOTRAIN_CHECK(data, "loader: no dataset");
  SPOTRAIN_CHECK(data->size() > 0, "loader: dataset ", data->name(), " is empty");
  return data->size();
}

}  // namespace

Loader::Loader(std::shared_ptr<const Dataset> data, LoaderOptions opt)
    : data_(std::move(data)),
      opt_(std::move(opt)),
      sampler_(checked_size(data_), opt_.seed, opt_.train) {
  shape_ = data_->image_shape();
  const int64_t size = data_->size();
  SPOTRAIN_CHECK(opt_.batch_size > 0, "--batch-size must be positive");
  SPOTRAIN_CHECK(opt_.world >= 1 && opt_.rank >= 0 && opt_.rank < opt_.world, "loader: rank ",
                 opt_.rank, " is outside a world of ", opt_.world, " ranks");
  SPOTRAIN_CHECK(opt_.workers >= 1, "--workers must be at least 1, got ", opt_.workers);
  SPOTRAIN_CHECK(opt_.prefetch >= 0, "loader: prefetch must be >= 0, got ", opt_.prefetch);
  SPOTRAIN_CHECK(shape_.h > 0 && shape_.w > 0 && shape_.c > 0, "loader: dataset ", data_->name(),
                 " has image shape ", shape_.h, "x", shape_.w, "x", shape_.c);
  check_transform_options(opt_.transforms, shape_);
  if (opt_.train) {
    const int64_t global = opt_.batch_size * opt_.world;
    SPOTRAIN_CHECK(global <= size, "--batch-size ", opt_.batch_size, " x ", opt_.world,
                   " ranks is larger than the dataset (", size, " samples)");
    batches_ = Sampler::batches_per_epoch(size, global, /*drop_last=*/true);
    samples_ = batches_ * opt_.batch_size;
  } else {
    base_order_ = eval_indices(size, opt_.rank, opt_.world);
    samples_ = int64_t(base_order_.size());
    batches_ = Sampler::batches_per_epoch(samples_, opt_.batch_size, false);
  }
  window_ = std::max<int64_t>({int64_t(opt_.prefetch), int64_t(opt_.workers), 1});
  threads_.reserve(size_t(opt_.workers));
  for (int i = 0; i < opt_.workers; ++i) threads_.emplace_back([this] { worker_loop(); });
}

Loader::~Loader() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  ready_cv_.notify_all();
  for (auto& t : threads_) t.join();
}

void Loader::start_epoch(int64_t epoch, int64_t first_batch) {
  SPOTRAIN_CHECK(epoch >= 0, "loader: epoch must be >= 0, got ", epoch);
  SPOTRAIN_CHECK(first_batch >= 0 && first_batch <= batches_, "loader: cannot start epoch ", epoch,
                 " at batch ", first_batch, "; it has ", batches_, " batches");
  auto plan = std::make_shared<Plan>();
  plan->epoch = epoch;
  if (opt_.train) {
    // This rank's part of each global batch, concatenated: batch b is [b*B, (b+1)*B).
    const std::vector<int64_t> perm = sampler_.permutation(epoch);
    const int64_t global = opt_.batch_size * opt_.world;
    plan->order.reserve(size_t(batches_ * opt_.batch_size));
    for (int64_t b = 0; b < batches_; ++b) {
      std::vector<int64_t> part = Sampler::rank_slice(perm, b, global, opt_.rank, opt_.world);
      plan->order.insert(plan->order.end(), part.begin(), part.end());
    }
  } else {
    plan->order = base_order_;
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    gen_.fetch_add(1);
    plan_ = std::move(plan);
    ready_.clear();
    next_task_ = next_out_ = first_batch;
    end_batch_ = batches_;
  }
  work_cv_.notify_all();
}

bool Loader::next(Batch& out) {
  Slot slot;
  {
    std::unique_lock<std::mutex> lk(mu_);
    SPOTRAIN_CHECK(plan_, "loader: next() called before start_epoch()");
    if (next_out_ >= end_batch_) return false;
    ready_cv_.wait(lk, [&] { return ready_.count(next_out_) > 0; });
    auto it = ready_.find(next_out_);
    slot = std::move(it->second);
    ready_.erase(it);
    ++next_out_;
  }
  work_cv_.notify_all();  // the prefetch window moved
  if (slot.error) std::rethrow_exception(slot.error);
  out = std::move(slot.batch);
  return true;
}

void Loader::worker_loop() {
  std::vector<uint8_t> buf(size_t(shape_.numel()));  // (H, W, C) u8 scratch
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    work_cv_.wait(lk, [&] {
      return stop_ || (plan_ && next_task_ < end_batch_ && next_task_ < next_out_ + window_);
    });
    if (stop_) return;
    std::shared_ptr<const Plan> plan = plan_;
    const uint64_t gen = gen_.load();
    const int64_t b = next_task_++;
    lk.unlock();

    Slot slot;
    try {
      produce(*plan, b, gen, slot.batch, buf);
    } catch (const Error&) {
      slot.error = std::current_exception();
    } catch (const std::exception& e) {
      slot.error = std::make_exception_ptr(
          Error(str("data loader: batch ", b, " of epoch ", plan->epoch, " failed: ", e.what())));
    } catch (...) {
      slot.error = std::make_exception_ptr(
          Error(str("data loader: batch ", b, " of epoch ", plan->epoch, " failed: unknown exception")));
    }

    lk.lock();
    if (gen != gen_.load() || stop_) continue;  // cancelled by start_epoch or shutdown: drop it
    ready_.emplace(b, std::move(slot));
    ready_cv_.notify_all();
  }
}

void Loader::produce(const Plan& plan, int64_t b, uint64_t gen, Batch& out, std::vector<uint8_t>& buf) {
  const int64_t B = opt_.batch_size;
  const int64_t begin = b * B;
  const int64_t n = std::min<int64_t>(B, int64_t(plan.order.size()) - begin);
  const int64_t per_image = shape_.numel();
  out.epoch = plan.epoch;
  out.batch_index = b;
  out.images = Tensor::host({n, shape_.c, shape_.h, shape_.w}, DType::f32, Layout::nhwc);
  out.labels.assign(size_t(n), 0);
  out.sample_ids.assign(plan.order.begin() + begin, plan.order.begin() + begin + n);
  float* dst = out.images.data<float>();  // (n, H, W, C) fp32
  for (int64_t i = 0; i < n; ++i) {
    if (stop_.load(std::memory_order_relaxed) || gen_.load(std::memory_order_relaxed) != gen)
      return;  // cancelled; the caller drops this batch
    const int64_t id = out.sample_ids[size_t(i)];
    int32_t label = -1;
    data_->get(id, buf.data(), &label);
    SPOTRAIN_CHECK(label >= 0 && label < data_->num_classes(), data_->name(), ": sample ", id,
                   " has label ", label, ", outside [0, ", data_->num_classes(), ")");
    out.labels[size_t(i)] = label;
    transform_image(buf.data(), shape_, opt_.transforms, opt_.train, opt_.seed, plan.epoch, id,
                    dst + i * per_image);
  }
}

}  // namespace io
}  // namespace spotrain
