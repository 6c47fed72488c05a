// find_resume_point, run_split, load_resume_point, init_from_weights and record_resume (see resume.h).
#include "run/resume.h"

#include <algorithm>
#include <filesystem>
#include <type_traits>
#include <vector>

#include "checkpoints/checkpoint.h"
#include "core/error.h"
#include "core/log.h"

namespace spotrain {

namespace {

// What the holder tells every rank of the checkpoint it found.
struct PointHeader {
  int64_t status = 0;  // 0: none found, 1: found, -1: failed (the holder has the error)
  int64_t step = 0, epoch = 0, batch_in_epoch = 0;
  int64_t global_batch = 0, world = 0;
};
static_assert(std::is_trivially_copyable<PointHeader>::value, "broadcast as bytes");

// The holder reads the checkpoint's record: the model first (another model's tensors would be
// refused one by one, less clearly), and the optimizer, whose momentum buffers mean different
// things for SGD and LARS (LARS keeps the learning rate inside).
PointHeader read_point(const RunConfig& cfg, const std::string& path) {
  const CheckpointInfo ci = read_checkpoint_info(path);
  SPOTRAIN_CHECK(ci.model == cfg.model, "checkpoint ", path, " is a ", ci.model, " checkpoint; this run trains ",
                 cfg.model);
  SPOTRAIN_CHECK(ci.optimizer_kind == cfg.optimizer, "checkpoint ", path, " was trained with --optimizer ",
                 ci.optimizer_kind, "; this run asks for ", cfg.optimizer, " (their momentum buffers differ). ",
                 "Resume with --optimizer ", ci.optimizer_kind, ", or start a new run from its weights with --init-from");
  const TrainPosition at = position_of(ci);
  PointHeader h;
  h.status = 1;
  h.step = at.step;
  h.epoch = at.epoch;
  h.batch_in_epoch = at.batch_in_epoch;
  h.world = ci.world_size > 0 ? ci.world_size : 1;
  // A checkpoint older than the record of its global batch: this run's settings on its ranks.
  h.global_batch = ci.global_batch > 0 ? ci.global_batch : global_batch(cfg.batch_size, h.world, cfg.accum_steps);
  return h;
}

// What the holder tells every rank once it loaded the state.
struct StateHeader {
  int64_t status = 0;  // 1: loaded, -1: failed (the holder has the error)
  int64_t sgd_steps = 0;
  int64_t has_ema = 0;  // the holder loaded the weights' moving average (--ema-decay)
  LossScalerState scaler;
};
static_assert(std::is_trivially_copyable<StateHeader>::value, "broadcast as bytes");

// The holder's outcome `status` (and its error) to every rank: the holder rethrows its own
// error, every other rank one that names the holder.
template <class Header>
void share_outcome(Session& session, int holder, Header& h, const std::string& error, const char* what) {
  if (session.world() > 1)
    session.worker().run(what, [&] { session.comm().broadcast(&h, sizeof h, holder); });
  if (h.status >= 0) return;
  if (session.rank() == holder) throw Error(error);
  SPOTRAIN_THROW("rank ", holder, " could not load the checkpoint to resume from (its error says why)");
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

ResumePoint find_resume_point(const RunConfig& cfg, Session& session, const RunStorage& storage) {
  ResumePoint p;
  if (cfg.resume == "none") return p;
  const Holder holder = find_holder(cfg, session, storage);
  PointHeader h;
  std::string error;
  if (holder.found && session.rank() == holder.rank) {
    try {
      h = read_point(cfg, holder.path);
    } catch (const std::exception& e) {
      h.status = -1;
      error = e.what();
    }
  }
  share_outcome(session, holder.rank, h, error, "broadcast of the resume point");
  if (h.status == 0) {
    log_info(str("--resume ", cfg.resume, ": no checkpoint in ", cfg.ckpt_dir, "; starting from scratch"));
    return p;
  }
  // Every rank learns the file's name (a rank with a copy of its own may well hold it too),
  // before anything from its content can be refused.
  std::string name = session.rank() == holder.rank ? std::filesystem::path(holder.path).filename().string() : "";
  name.resize(64);
  if (session.world() > 1)
    session.worker().run("broadcast of the checkpoint's name",
                         [&] { session.comm().broadcast(name.data(), name.size(), holder.rank); });
  name = name.c_str();
  p.found = true;
  p.holder = holder.rank;
  p.path = holder.path;
  p.checkpoint = session.rank() == holder.rank ? holder.path : name;
  p.from_named_file = !cfg.resume_from_folder();
  p.at = TrainPosition{h.step, h.epoch, h.batch_in_epoch};
  p.global_batch = h.global_batch;
  p.world = int(h.world);
  return p;
}

BatchSplit run_split(const RunConfig& cfg, const ResumePoint& p, int world) {
  if (!p.found) return first_split(world, cfg.batch_size, cfg.accum_steps);
  BatchSplit s;
  std::string why;
  SPOTRAIN_CHECK(split_evenly(p.global_batch, world, cfg.batch_size, &s, &why), "checkpoint ", p.checkpoint,
                 " was trained with a global batch of ", p.global_batch, " on ", p.world,
                 " rank(s) (it records both): ", why);
  if (s != first_split(world, cfg.batch_size, cfg.accum_steps))
    log_info(str("resuming a ", p.world, "-rank checkpoint on ", world, " rank(s): per-rank batch ", s.micro,
                 s.count(0) > 1 ? str(" x ", s.count(0), " micro-batches") : "", " keeps its global batch of ",
                 p.global_batch, " with --accum-steps ", s.count(0), " (the command line's --batch-size ",
                 cfg.batch_size, " --accum-steps ", cfg.accum_steps, " are overridden)"));
  return s;
}

void load_resume_point(const ResumePoint& p, Session& session, Training& t, WeightEma* ema) {
  SPOTRAIN_CHECK(p.found, "internal: load_resume_point without a checkpoint");
  const int root = p.holder;
  StateHeader h;
  std::string error;
  if (session.rank() == root) {
    try {
      const CheckpointInfo ci = load_training_state(p.path, *t.model, *t.sgd);
      h.status = 1;
      h.sgd_steps = t.sgd->steps();
      h.scaler = ci.scaler;
      if (ema && checkpoint_has_group(p.path, "ema")) {
        load_ema(p.path, *t.model, *ema);
        h.has_ema = 1;
      }
    } catch (const std::exception& e) {
      h.status = -1;
      error = e.what();
    }
  }
  share_outcome(session, root, h, error, "broadcast of the loaded state");
  Model& model = *t.model;
  if (session.world() > 1) {  // every rank continues from the holder's state
    session.broadcast_from(root, model.flat_params(), "the checkpoint's parameters");
    session.broadcast_from(root, t.sgd->momentum(), "the checkpoint's momentum");
    session.broadcast_from(root, model.flat_buffers(), "the checkpoint's BN statistics");
    t.sgd->set_steps(h.sgd_steps);
  }
  if (ema && !h.has_ema) {  // a checkpoint from a run without the average: it starts here
    ema->restart();
    log_info("the checkpoint holds no moving average of the weights: --ema-decay starts from its weights");
  } else if (ema && session.world() > 1) {
    session.broadcast_from(root, ema->params(), "the checkpoint's moving average");
    for (Tensor& b : ema->buffers()) session.broadcast_from(root, b, "the moving average's statistics");
  }
  t.scaler->set_state(h.scaler);
  log_info(str("resumed from ", p.checkpoint, root == session.rank() ? std::string() : str(" (rank ", root, "'s copy)"),
               ": step ", p.at.step, ", ", progress_text(p.at)));
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

void record_resume(MetricsSink& metrics, const ResumePoint& r, int world) {
  if (!r.found) return;
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
