// resume_training and record_resume (see resume.h).
#include "run/resume.h"

#include <algorithm>
#include <filesystem>
#include <vector>

#include "checkpoints/checkpoint.h"
#include "core/error.h"
#include "core/log.h"

namespace spotrain {

namespace {

// The holder loads the checkpoint; the header says what every rank needs of it.
ResumeHeader load_checkpoint(const RunConfig& cfg, Training& t, WeightEma* ema, const std::string& path) {
  ResumeHeader h;
  // The model first: another model's tensors would be refused one by one, less clearly.
  const CheckpointInfo recorded = read_checkpoint_info(path);
  const std::string& model = recorded.model;
  SPOTRAIN_CHECK(model == cfg.model, "checkpoint ", path, " is a ", model,
                 " checkpoint; this run trains ", cfg.model);
  // The momentum buffers of SGD and LARS mean different things (LARS keeps the learning rate
  // inside): one cannot go on from the other's.
  SPOTRAIN_CHECK(recorded.optimizer_kind == cfg.optimizer, "checkpoint ", path,
                 " was trained with --optimizer ", recorded.optimizer_kind, "; this run asks for ",
                 cfg.optimizer, " (their momentum buffers differ). Resume with --optimizer ",
                 recorded.optimizer_kind, ", or start a new run from its weights with --init-from");
  CheckpointInfo ci = load_training_state(path, *t.model, *t.sgd);
  const TrainPosition at = position_of(ci);
  h.status = 1;
  h.step = at.step;
  h.epoch = at.epoch;
  h.batch_in_epoch = at.batch_in_epoch;
  h.world = ci.world_size > 0 ? ci.world_size : 1;
  h.global_batch = ci.global_batch > 0 ? ci.global_batch : cfg.batch_size * h.world * cfg.accum_steps;
  h.sgd_steps = t.sgd->steps();
  h.scaler = ci.scaler;
  if (ema && checkpoint_has_group(path, "ema")) {
    load_ema(path, *t.model, *ema);
    h.has_ema = 1;
  }
  return h;
}

// The checkpoint to resume from and the rank that holds it. --resume PATH: rank 0's file.
// --resume auto|latest: the newest good checkpoint any writer's folder holds (the lowest rank on a
// tie), so a rank whose disk is new (a replacement host) resumes from another's copy. When no
// folder holds a good one but some shows that one was written (`latest`, checkpoint files),
// every copy was lost: that is refused, not trained again from scratch.
struct Holder {
  int rank = 0;
  std::string path;  // on the holder ("" when there is no checkpoint)
  bool found = false;
};

Holder find_holder(const RunConfig& cfg, Session& session, const RunStorage& storage) {
  Holder h;
  if (!cfg.resume_from_folder()) {
    h.found = true;
    if (session.rank() == 0) h.path = cfg.resume;
    return h;
  }
  namespace fs = std::filesystem;
  int64_t step = -1;
  bool evidence = false;
  std::string path;
  std::vector<std::string> skipped;  // this rank's unusable files, newest first
  if (storage.writer) {
    path = newest_good_checkpoint(cfg.ckpt_dir, checkpoint_expectation(true), &skipped);
    if (!path.empty()) step = read_checkpoint_info(path).global_step;
    std::error_code ec;
    evidence = fs::exists(cfg.ckpt_dir + "/latest", ec) || !list_checkpoints(cfg.ckpt_dir).empty();
  }
  std::vector<uint64_t> all{(uint64_t(step + 1) << 1) | (evidence ? 1u : 0u)};
  if (session.world() > 1)
    session.worker().run("all-gather of the checkpoints each rank holds",
                         [&] { all = session.comm().allgather(all[0]); });
  int64_t best = -1;
  std::string lost;
  for (size_t r = 0; r < all.size(); ++r) {
    const int64_t s = int64_t(all[r] >> 1) - 1;
    if (s > best) {
      best = s;
      h.rank = int(r);
    }
    if (all[r] & 1u) lost += str(lost.empty() ? "" : ", ", r);
  }
  if (best < 0) {
    SPOTRAIN_CHECK(cfg.resume != "latest", "--resume latest: no checkpoint of this run in ",
                   cfg.ckpt_dir, " on any rank (a restart after one was written must find it: ",
                   "were the disks that held it replaced?). Pass --resume auto to start from "
                   "scratch when there is none", skipped_checkpoints_text(skipped));
    SPOTRAIN_CHECK(lost.empty(), "--resume auto: no good checkpoint of this run is left in ", cfg.ckpt_dir,
                   " on any rank, though the folder of rank(s) ", lost, " shows that checkpoints were "
                   "written (a `latest` pointer or checkpoint files): every copy was lost or is corrupt. "
                   "Start the run over with --new-run (its files move to previous-<time>/), or resume "
                   "from a file with --resume PATH", skipped_checkpoints_text(skipped));
    return h;
  }
  h.found = true;
  if (session.rank() == h.rank) h.path = path;
  return h;
}

}  // namespace

Resumed resume_training(const RunConfig& cfg, Session& session, Training& t, WeightEma* ema,
                        const RunStorage& storage) {
  Resumed r;
  r.per_rank_batch = cfg.batch_size;
  r.accum_steps = cfg.accum_steps;
  if (cfg.resume == "none") return r;
  const Holder holder = find_holder(cfg, session, storage);
  ResumeHeader h;
  std::string error;
  if (holder.found && session.rank() == holder.rank) {
    try {
      h = load_checkpoint(cfg, t, ema, holder.path);
    } catch (const std::exception& e) {
      h.status = -1;
      error = e.what();
    }
  }
  if (session.world() > 1)
    session.worker().run("broadcast of the resume point",
                         [&] { session.comm().broadcast(&h, sizeof h, holder.rank); });
  if (h.status < 0) {
    if (session.rank() == holder.rank) throw Error(error);
    SPOTRAIN_THROW("rank ", holder.rank, " could not load the checkpoint to resume from (its error says why)");
  }
  if (h.status == 0) {
    log_info(str("--resume ", cfg.resume, ": no checkpoint in ", cfg.ckpt_dir,
                 "; starting from scratch"));
    return r;
  }
  const int64_t world = session.world();
  const int root = holder.rank;
  // Every rank learns the file's name (a rank with a copy of its own may well hold it too),
  // before anything from its content can be refused.
  std::string name = session.rank() == root ? std::filesystem::path(holder.path).filename().string() : "";
  name.resize(64);
  if (world > 1)
    session.worker().run("broadcast of the checkpoint's name", [&] { session.comm().broadcast(name.data(), name.size(), root); });
  name = name.c_str();
  r.checkpoint = session.rank() == root ? holder.path : name;
  BatchSplit split;
  try {
    split = split_global_batch(h.global_batch, world, cfg.batch_size);
  } catch (const Error& e) {
    SPOTRAIN_THROW("checkpoint ", r.checkpoint, " was trained with a global batch of ", h.global_batch,
                   " on ", h.world, " rank(s) (it records both): ", e.what());
  }
  r.per_rank_batch = split.per_rank_batch;
  r.accum_steps = split.accum_steps;
  if (r.per_rank_batch != cfg.batch_size || r.accum_steps != cfg.accum_steps)
    log_info(str("resuming a ", h.world, "-rank checkpoint on ", world, " rank(s): per-rank batch ",
                 r.per_rank_batch, r.accum_steps > 1 ? str(" x ", r.accum_steps, " micro-batches") : "",
                 " keeps its global batch of ", h.global_batch, " with --accum-steps ", r.accum_steps,
                 " (the command line's --batch-size ", cfg.batch_size, " --accum-steps ",
                 cfg.accum_steps, " are overridden)"));
  Model& model = *t.model;
  if (world > 1) {  // every rank continues from the holder's state
    session.broadcast_from(root, model.flat_params(), "the checkpoint's parameters");
    session.broadcast_from(root, t.sgd->momentum(), "the checkpoint's momentum");
    session.broadcast_from(root, model.flat_buffers(), "the checkpoint's BN statistics");
    t.sgd->set_steps(h.sgd_steps);
  }
  if (ema && !h.has_ema) {  // a checkpoint from a run without the average: it starts here
    ema->restart();
    log_info("the checkpoint holds no moving average of the weights: --ema-decay starts from its weights");
  } else if (ema && world > 1) {
    session.broadcast_from(root, ema->params(), "the checkpoint's moving average");
    for (Tensor& b : ema->buffers()) session.broadcast_from(root, b, "the moving average's statistics");
  }
  t.scaler->set_state(h.scaler);
  r.resumed = true;
  r.from_named_file = !cfg.resume_from_folder();
  r.at = TrainPosition{h.step, h.epoch, h.batch_in_epoch};
  r.holder = root;
  log_info(str("resumed from ", session.rank() == root ? holder.path : name,
               root == session.rank() ? std::string() : str(" (rank ", root, "'s copy)"), ": step ",
               r.at.step, ", ", progress_text(r.at)));
  return r;
}

BatchSplit split_global_batch(int64_t global_batch, int64_t world, int64_t max_batch) {
  SPOTRAIN_CHECK(global_batch > 0 && world > 0 && max_batch > 0, "internal: split of a global batch of ",
                 global_batch, " over ", world, " ranks of at most ", max_batch);
  auto fits = [&](int64_t w) {
    return (global_batch % w == 0 && global_batch / w <= max_batch) || global_batch % (w * max_batch) == 0;
  };
  if (global_batch % world == 0 && global_batch / world <= max_batch)
    return BatchSplit{global_batch / world, 1};
  if (global_batch % (world * max_batch) == 0)
    return BatchSplit{max_batch, int(global_batch / (world * max_batch))};
  // The rank counts that work: those that divide the global batch into at most max_batch per
  // rank, and those whose ranks x max_batch divides it.
  std::vector<int64_t> ok;
  for (int64_t w = 1; w <= std::min<int64_t>(global_batch, int64_t(1) << 20); ++w)
    if (fits(w)) ok.push_back(w);  // 1 always fits
  std::string counts;
  const size_t shown = std::min<size_t>(ok.size(), 12);
  for (size_t i = 0; i < shown; ++i)
    counts += str(i == 0 ? "" : i + 1 == shown && shown == ok.size() ? " or " : ", ", ok[i]);
  if (shown < ok.size()) counts += str(" or one of ", ok.size() - shown, " larger counts");
  const bool even = global_batch % world == 0;
  SPOTRAIN_THROW("it does not divide over ", world, " ranks",
                 even ? str(" into micro-batches of at most --batch-size ", max_batch, " (",
                            global_batch / world, " images per rank and step)")
                      : std::string(),
                 "; the global batch is ranks x per-rank batch x --accum-steps. Resume on ", counts,
                 " ranks", even ? str(", or with a --batch-size that divides ", global_batch / world) : "");
}

namespace {

// "a, b, c and 4 more": the first few of a list, for a log line.
std::string first_few(const std::vector<std::string>& all, size_t few = 6) {
  std::string out;
  for (size_t i = 0; i < all.size() && i < few; ++i) out += str(i ? ", " : "", all[i]);
  if (all.size() > few) out += str(" and ", all.size() - few, " more");
  return out;
}

}  // namespace

void init_from_weights(const RunConfig& cfg, Session& session, Training& t, WeightEma* ema) {
  if (cfg.init_from.empty()) return;
  int64_t status = 1;
  std::string error;
  if (session.rank() == 0) {
    try {
      const MatchedWeights m = load_matching_weights(cfg.init_from, *t.model);
      if (m.model != cfg.model)
        log_info(str("warning: --init-from ", cfg.init_from, " is a ", m.model, " checkpoint and this run trains a ",
                     cfg.model, ": only the tensors whose names and shapes match are taken"));
      log_info(str("--init-from ", cfg.init_from, " (a ", m.model, "): ", m.loaded, " of ",
                   t.model->params().size() + t.model->buffers().size(), " tensors loaded",
                   m.skipped.empty() ? std::string() : str("; starting fresh: ", first_few(m.skipped)),
                   m.unused.empty() ? std::string() : str("; not used: ", first_few(m.unused)),
                   "; step 0, a new optimizer"));
    } catch (const std::exception& e) {
      status = -1;
      error = str("--init-from: ", e.what());
    }
  }
  if (session.world() > 1)
    session.worker().run("broadcast of --init-from's outcome",
                         [&] { session.comm().broadcast(&status, sizeof status, 0); });
  if (status < 0) {
    if (session.rank() == 0) throw Error(error);
    SPOTRAIN_THROW("rank 0 could not load --init-from ", cfg.init_from, " (its error says why)");
  }
  if (session.world() > 1) {
    session.broadcast_from_rank0(t.model->flat_params(), "--init-from's parameters");
    session.broadcast_from_rank0(t.model->flat_buffers(), "--init-from's BN statistics");
  }
  if (ema) ema->restart();
}

void record_resume(MetricsSink& metrics, const Resumed& r, int world) {
  if (!r.resumed) return;
  const nlohmann::json& prev = metrics.previous_last();
  std::string after = "unknown (no metrics of the previous process)";
  if (prev.is_object() && prev.value("type", "") == "stop")
    after = "stopped by " + prev.value("reason", std::string("?"));
  else if (prev.is_object() && prev.value("type", "") == "end")
    after = "finished";
  else if (prev.is_object())
    after = str("ended without a stop record after step ", prev.value("step", int64_t(0)),
                " (killed or crashed)");
  // The steps after the checkpoint's are trained again: their earlier records are history no more.
  const int64_t superseded = metrics.mark_superseded_after(r.at.step);
  metrics.write("resume", {{"step", r.at.step}, {"epoch", r.at.epoch + 1},
                           {"batch_in_epoch", r.at.batch_in_epoch}, {"checkpoint", r.checkpoint},
                           {"previous", after}, {"ranks", world}, {"superseded_records", superseded}});
}

}  // namespace spotrain
