// session_options, training_spec, loader_options, check_ranks_agree (see setup.h).
#include "run/setup.h"

#include <nlohmann/json.hpp>

#include <functional>
#include <vector>

#include "core/error.h"
#include "kernels/kernel_cache.h"

namespace spotrain {

SessionOptions session_options(const RunConfig& cfg) {
  SessionOptions so;
  so.device = cfg.device;
  so.backend.threads = cfg.threads;
  so.backend.deterministic = cfg.deterministic;
  so.backend.tf32 = cfg.precision == "tf32";  // fp32 storage, TF32 tensor-core math on GPUs
  so.backend.autotune = cfg.autotune;
  so.backend.cpu_activations = preferred_cpu_activations(compute_dtype(parse_precision(cfg.precision)));
  // --deterministic and --no-autotune take the heuristics' choices: nothing to read or write.
  so.backend.kernel_cache = cfg.deterministic || !cfg.autotune
                                ? ""
                                : KernelCache::resolve_path(cfg.kernel_cache, cfg.ckpt_dir);
  so.comm_timeout = cfg.comm_timeout;
  so.device_comm = cfg.device_comm;
  return so;
}

TrainingSpec training_spec(const RunConfig& cfg, const BatchSplit& split, int rank, int num_classes,
                           int in_channels) {
  TrainingSpec s;
  s.net.arch = cfg.model;
  s.net.num_classes = num_classes;
  s.net.in_channels = in_channels;
  s.net.zero_init_residual = cfg.zero_init_residual;
  s.net.grad_checkpoint = cfg.grad_checkpoint;
  s.fusion = cfg.fusion;
  s.seed = cfg.seed;
  s.precision = parse_precision(cfg.precision);
  s.sgd.momentum = cfg.momentum;
  s.sgd.nesterov = cfg.nesterov;
  s.sgd.weight_decay = cfg.weight_decay;
  s.sgd.decay_bn_and_bias = cfg.decay_bn_and_bias;
  s.sgd.kind = cfg.optimizer;
  s.sgd.lars_trust = cfg.lars_trust;
  s.sgd.lars_epsilon = cfg.lars_epsilon;
  s.scaler.static_scale = cfg.loss_scale;
  s.scaler.max_consecutive_overflows = cfg.max_overflow_steps;
  s.reducer.bucket_mb = cfg.bucket_mb;
  s.reducer.compression = cfg.grad_compression;
  s.cuda_graph = cfg.cuda_graph;
  s.accum_steps = split.count(rank);
  s.step_micro_batches = split.units();
  if (!cfg.ckpt_dir.empty()) s.fast_path_file = cfg.ckpt_dir + "/fast-paths.json";
  return s;
}

io::LoaderOptions loader_options(const RunConfig& cfg, const BatchSplit& split, const DataPair& data,
                                 Session& session) {
  io::LoaderOptions lo;
  lo.batch_size = split.micro;
  lo.accum_steps = split.count(session.rank());
  lo.units = split.units();
  lo.first_unit = split.first(session.rank());
  lo.train = true;
  lo.seed = cfg.seed;
  lo.workers = cfg.workers;
  lo.prefetch = cfg.prefetch;
  lo.image_allocator = &session.backend().host_staging_allocator();  // pinned on CUDA
  lo.pixels_u8 = session.backend().normalizes_pixels();
  lo.augment = cfg.augment;
  lo.erasing.p = cfg.random_erasing;
  lo.mix.mixup_alpha = cfg.mixup;
  lo.mix.cutmix_alpha = cfg.cutmix;
  lo.mix.switch_prob = cfg.mix_switch_prob;
  lo.max_bad_fraction = cfg.max_bad_fraction;
  if (data.train->encoded()) lo.image = image_transforms_for(*data.train);
  lo.rank = session.rank();
  lo.world = session.world();
  lo.transforms = transforms_for(data.kind, *data.train, true, cfg.augment);
  return lo;
}

void check_ranks_agree(const RunConfig& cfg, Session& session) {
  for_each_setting(cfg, [&](const SettingInfo& s, const auto& value) {
    if (s.flags & kPerNode) return;
    nlohmann::json v = value;
    uint64_t h = uint64_t(std::hash<std::string>{}(v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)));
    std::vector<uint64_t> all;
    session.worker().run(str("start-up check of ", s.name), [&] { all = session.comm().allgather(h); });
    std::string flag = s.flag;
    flag = flag.substr(0, flag.find(','));  // "--augment,!--no-augment" -> "--augment"
    for (size_t r = 1; r < all.size(); ++r)
      SPOTRAIN_CHECK(all[r] == all[0], "rank ", r, " was started with a different ", flag,
                     " than rank 0; every rank must get the same settings");
  });
}

}  // namespace spotrain
