// Evaluation over a whole dataset (see evaluate.h).
#include "engine/evaluate.h"

#include <algorithm>
#include <memory>
#include <vector>

#include "engine/data.h"

namespace spotrain {

EvalResult evaluate_model(Model& model, const io::Dataset& data, const std::string& data_kind,
                          int64_t batch_size, DType compute, CommWorker* worker, int workers,
                          double max_bad_fraction, const EvalBatchHook& on_batch) {
  io::LoaderOptions lo;
  lo.batch_size = batch_size;
  lo.train = false;
  lo.workers = std::max(1, workers);
  lo.max_bad_fraction = max_bad_fraction;
  lo.image_allocator = &model.backend().host_staging_allocator();  // pinned on CUDA
  if (data.encoded()) lo.image = image_transforms_for(data);
  if (worker) {
    lo.rank = worker->comm().rank();
    lo.world = worker->comm().size();
  }
  lo.transforms = transforms_for(data_kind, data, false, false);
  io::Loader loader(std::shared_ptr<const io::Dataset>(&data, [](const io::Dataset*) {}), lo);
  loader.start_epoch(0);
  io::Batch b;
  EvalResult r;
  double loss_sum = 0;
  int64_t top1 = 0, top5 = 0;
  Backend& be = model.backend();
  while (loader.next(b)) {
    const Tensor x = b.images.dtype() == DType::u8 ? be.upload_pixels(b.images, b.norm, compute)
                                                   : be.upload_images(b.images, compute);
    Tensor logits = model.forward(x, /*training=*/false);
    LossResult l = be.softmax_xent(logits, b.labels.data(), 0.f, 1.f, nullptr);
    if (on_batch) on_batch(b, logits);
    int64_t n = int64_t(b.labels.size());
    loss_sum += l.loss * double(n);
    top1 += l.top1;
    top5 += l.top5;
    r.samples += n;
  }
  if (worker) {
    double sums[4] = {loss_sum, double(top1), double(top5), double(r.samples)};
    sum_across_ranks(*worker, sums, 4, "evaluation counts");
    loss_sum = sums[0];
    top1 = int64_t(sums[1]);
    top5 = int64_t(sums[2]);
    r.samples = int64_t(sums[3]);
  }
  if (r.samples > 0) {
    r.loss = loss_sum / double(r.samples);
    r.top1 = double(top1) / double(r.samples);
    r.top5 = double(top5) / double(r.samples);
  }
  return r;
}

}  // namespace spotrain
