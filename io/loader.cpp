// Threaded loader (see loader.h). Each batch is one task: a worker takes the next batch
// index inside the prefetch window, fills it, and files it under its index; next() hands the
// batches out in index order. start_epoch bumps a generation so stale work is dropped.
#include "io/loader.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include <cstdio>
#include "io/jpeg.h"
#include "io/png.h"

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
  if (data_->encoded())
    SPOTRAIN_CHECK(shape_.c == 3 && shape_.h == opt_.image.out_size && shape_.w == opt_.image.out_size,
                   "loader: ", data_->name(), " makes ", shape_.h, "x", shape_.w, "x", shape_.c,
                   " images but the transforms crop ", opt_.image.out_size);
  u8_ = opt_.pixels_u8 && data_->encoded() && !(opt_.train && (opt_.erasing.p > 0 || opt_.mix.enabled()));
  SPOTRAIN_CHECK(opt_.max_bad_fraction >= 0 && opt_.max_bad_fraction <= 1,
                 "--max-bad-fraction must be in [0, 1], got ", opt_.max_bad_fraction);
  SPOTRAIN_CHECK(opt_.accum_steps >= 1, "--accum-steps must be at least 1, got ", opt_.accum_steps);
  if (opt_.train) {
    units_ = opt_.units > 0 ? opt_.units : int64_t(opt_.world) * opt_.accum_steps;
    micro_ = opt_.batch_size;
    set_share(micro_, units_, opt_.first_unit >= 0 ? opt_.first_unit : int64_t(opt_.rank) * opt_.accum_steps,
              opt_.accum_steps);
    const int64_t global = opt_.batch_size * units_;
    SPOTRAIN_CHECK(global <= size, "--batch-size ", opt_.batch_size, " x ", opt_.world, " ranks",
                   units_ > opt_.world ? str(" x ", units_ / opt_.world, " micro-batches") : std::string(),
                   " is larger than the dataset (", size, " samples)");
    batches_ = Sampler::batches_per_epoch(size, global, /*drop_last=*/true);
    samples_ = batches_ * opt_.batch_size * accum_;
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
  plan->accum = accum_;
  plan->micro = opt_.train ? micro_ : opt_.batch_size;
  if (opt_.train) {
    // This rank's part of each global batch, concatenated: (micro-)batch m is [m*B, (m+1)*B).
    // Micro-batch j of step b is the part of rank first_unit + j of `units` (io/sampler.h).
    const std::vector<int64_t> perm = sampler_.permutation(epoch);
    const int64_t global = micro_ * units_;
    plan->order.reserve(size_t(batches_ * accum_ * micro_));
    for (int64_t b = 0; b < batches_; ++b)
      for (int j = 0; j < accum_; ++j) {
        std::vector<int64_t> part = Sampler::rank_slice(perm, b, global, int(first_unit_ + j), int(units_));
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
    next_task_ = next_out_ = first_batch * accum_;
    end_batch_ = batches_ * accum_;
  }
  work_cv_.notify_all();
}

void Loader::set_share(int64_t micro, int64_t units, int64_t first_unit, int accum_steps) {
  SPOTRAIN_CHECK(opt_.train, "internal: a share of the global batch is for training");
  SPOTRAIN_CHECK(micro > 0 && micro * units == micro_ * units_, "internal: a share of ", units,
                 " micro-batches of ", micro, " is not the global batch of ", micro_ * units_);
  SPOTRAIN_CHECK(accum_steps >= 1 && first_unit >= 0 && first_unit + accum_steps <= units,
                 "internal: micro-batches ", first_unit, " to ", first_unit + accum_steps - 1, " of a step of ", units);
  std::lock_guard<std::mutex> lk(mu_);
  SPOTRAIN_CHECK(!plan_ || next_out_ % accum_ == 0, "internal: a share changed inside a step");
  micro_ = micro;  // the epoch under way keeps its plan's
  units_ = units;
  first_unit_ = first_unit;
  accum_ = accum_steps;
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
  Scratch scratch;
  if (!data_->encoded()) scratch.u8.resize(size_t(shape_.numel()));  // (H, W, C) u8
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
      produce(*plan, b, gen, slot.batch, scratch);
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

std::vector<BadSample> Loader::bad_samples() const {
  std::lock_guard<std::mutex> lk(bad_mu_);
  return bad_;
}

void Loader::note_bad(int64_t id, const std::string& why) {
  std::lock_guard<std::mutex> lk(bad_mu_);
  if (!bad_ids_.insert(id).second) return;
  bad_.push_back(BadSample{id, why});
  std::fprintf(stderr, "warning: skipping unreadable image %s\n", why.c_str());
  const double limit = opt_.max_bad_fraction * double(data_->size());
  SPOTRAIN_CHECK(double(bad_ids_.size()) <= limit, bad_ids_.size(), " unreadable images in ",
                 data_->name(), " (", data_->size(), " samples), more than --max-bad-fraction ",
                 opt_.max_bad_fraction, " allows; the first: ", bad_.front().what);
}

void Loader::decode_sample(int64_t id, int64_t epoch, Batch& out, int64_t i, int32_t* label,
                           Scratch& s) const {
  data_->read_encoded(id, &s.bytes, label);
  const ImageTransformOptions& t = opt_.image;
  const int64_t at = i * shape_.numel();
  auto resample = [&](const uint8_t* px, int w, int h, const CropBox& box) {
    if (u8_)
      resample_pixels(px, w, h, box, t, static_cast<uint8_t*>(out.images.write_raw()) + at, &s.f, 4);
    else
      resample_normalize(px, w, h, box, t, out.images.data<float>() + at, &s.f, 4);
  };
  if (is_png(s.bytes.data(), s.bytes.size())) {  // PNG: whole-image decode, same transforms
    int w = 0, h = 0;
    decode_png_rgbx(s.bytes.data(), s.bytes.size(), &s.u8, &w, &h);
    CropBox box = opt_.train && opt_.augment ? random_resized_crop(w, h, t, true, opt_.seed, epoch, id)
                                             : center_crop_box(w, h, t);
    resample(s.u8.data(), w, h, box);
    return;
  }
  JpegInfo info;
  std::string why;
  SPOTRAIN_CHECK(jpeg_info(s.bytes.data(), s.bytes.size(), &info, &why), why);
  CropBox box = opt_.train && opt_.augment
                    ? random_resized_crop(info.width, info.height, t, true, opt_.seed, epoch, id)
                    : center_crop_box(info.width, info.height, t);
  const int denom = pick_jpeg_denom(box, t.out_size);
  if (denom > 1) {  // the crop box in the reduced image's pixels
    const double sx = double(jpeg_scaled(info.width, denom)) / info.width;
    const double sy = double(jpeg_scaled(info.height, denom)) / info.height;
    box.x *= sx;
    box.w *= sx;
    box.y *= sy;
    box.h *= sy;
  }
  // Decode only the rows and columns the resampler reads: the box, plus the filter's reach
  // where taps may fall outside it (eval boxes clamp at the image edge, not the box).
  const int margin = box.clip ? 0 : int(std::ceil(std::max({box.w / t.out_size, box.h / t.out_size, 1.0}))) + 1;
  JpegRegion want;
  want.x = int(std::floor(box.x)) - margin;
  want.y = int(std::floor(box.y)) - margin;
  want.w = int(std::ceil(box.x + box.w)) + margin - want.x;
  want.h = int(std::ceil(box.y + box.h)) + margin - want.y;
  JpegRegion got;
  decode_jpeg_region(s.bytes.data(), s.bytes.size(), denom, t.fast_decode, want, &s.u8, &got, 4);
  box.x -= got.x;
  box.y -= got.y;
  resample(s.u8.data(), got.w, got.h, box);
}

void Loader::produce(const Plan& plan, int64_t b, uint64_t gen, Batch& out, Scratch& s) {
  const int64_t B = plan.micro;
  const int64_t begin = b * B;
  const int64_t n = std::min<int64_t>(B, int64_t(plan.order.size()) - begin);
  const int64_t per_image = shape_.numel();
  out.epoch = plan.epoch;
  out.batch_index = b / plan.accum;
  out.micro = int(b % plan.accum);
  out.images = Tensor({n, shape_.c, shape_.h, shape_.w}, u8_ ? DType::u8 : DType::f32,
                      opt_.image_allocator ? *opt_.image_allocator : Allocator::host(),
                      Layout::nhwc);
  for (int k = 0; k < 3; ++k) {
    out.norm.mean[k] = opt_.image.mean[k];
    out.norm.std[k] = opt_.image.std[k];
  }
  out.labels.assign(size_t(n), 0);
  out.sample_ids.assign(plan.order.begin() + begin, plan.order.begin() + begin + n);
  for (int64_t i = 0; i < n; ++i) {
    if (stop_.load(std::memory_order_relaxed) || gen_.load(std::memory_order_relaxed) != gen)
      return;  // cancelled; the caller drops this batch
    const int64_t id = out.sample_ids[size_t(i)];
    int32_t label = -1;
    if (data_->encoded()) {
      // A bad image is replaced by the next readable sample (with that sample's own draws),
      // so every batch stays full and the choice does not depend on thread timing.
      const int64_t size = data_->size();
      bool ok = false;
      for (int64_t k = 0; k < size && !ok; ++k) {
        const int64_t cand = (id + k) % size;
        try {
          decode_sample(cand, plan.epoch, out, i, &label, s);
          ok = true;
        } catch (const Error& e) {
          note_bad(cand, str(data_->sample_name(cand), ": ", e.what()));
        }
      }
      SPOTRAIN_CHECK(ok, data_->name(), ": no readable image at all");
      SPOTRAIN_CHECK(label >= 0 && label < data_->num_classes(), data_->name(), ": sample ", id,
                     " has label ", label, ", outside [0, ", data_->num_classes(), ")");
      out.labels[size_t(i)] = label;
      continue;
    }
    data_->get(id, s.u8.data(), &label);
    SPOTRAIN_CHECK(label >= 0 && label < data_->num_classes(), data_->name(), ": sample ", id,
                   " has label ", label, ", outside [0, ", data_->num_classes(), ")");
    out.labels[size_t(i)] = label;
    transform_image(s.u8.data(), shape_, opt_.transforms, opt_.train, opt_.seed, plan.epoch, id,
                    out.images.data<float>() + i * per_image);
  }
  if (opt_.train && (opt_.erasing.p > 0 || opt_.mix.enabled())) augment_batch(out, plan.epoch);
}

void Loader::augment_batch(Batch& out, int64_t epoch) const {
  const int64_t n = int64_t(out.labels.size()), per_image = shape_.numel();
  float* dst = out.images.data<float>();
  if (opt_.erasing.p > 0)
    for (int64_t i = 0; i < n; ++i)
      apply_erasing(dst + i * per_image, int(shape_.h), int(shape_.w), int(shape_.c),
                    draw_erasing(opt_.erasing, int(shape_.h), int(shape_.w), opt_.seed, epoch,
                                 out.sample_ids[size_t(i)]));
  if (!opt_.mix.enabled()) return;
  out.labels_b = out.labels;  // an unpaired last sample keeps its own label (lam 1)
  out.lam.assign(size_t(n), 1.f);
  for (int64_t i = 0; i + 1 < n; i += 2) {
    const PairMix m = draw_pair_mix(opt_.mix, int(shape_.h), int(shape_.w), opt_.seed, epoch,
                                    out.sample_ids[size_t(i)]);
    apply_pair_mix(dst + i * per_image, dst + (i + 1) * per_image, int(shape_.h), int(shape_.w),
                   int(shape_.c), m);
    out.labels_b[size_t(i)] = out.labels[size_t(i + 1)];
    out.labels_b[size_t(i + 1)] = out.labels[size_t(i)];
    out.lam[size_t(i)] = out.lam[size_t(i + 1)] = float(m.lambda);
  }
}

}  // namespace io
}  // namespace spotrain
