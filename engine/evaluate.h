// Evaluation: top-1 / top-5 and the loss of a model over a whole dataset, with fixed
// (non-random) transforms, split across ranks when a worker is given.
#pragma once
#include <cstdint>
#include <functional>
#include <string>

#include "comm/comm_worker.h"
#include "engine/model.h"
#include "io/dataset.h"
#include "io/loader.h"

namespace spotrain {

struct EvalResult {
  double loss = 0, top1 = 0, top5 = 0;  // top-k as fractions
  int64_t samples = 0;
};

// With a worker, the set is split across ranks and the counts summed, so every rank gets
// the whole set's figures. `on_batch`, when given, sees each batch with its logits.
using EvalBatchHook = std::function<void(const io::Batch&, const Tensor& logits)>;
EvalResult evaluate_model(Model& model, const io::Dataset& data, const std::string& data_kind,
                          int64_t batch_size, DType compute = DType::f32,
                          CommWorker* worker = nullptr, int workers = 1,
                          double max_bad_fraction = 0.001,
                          const EvalBatchHook& on_batch = nullptr);

}  // namespace spotrain
