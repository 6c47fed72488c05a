// resume_training and record_resume (see resume.h).
#include "run/resume.h"

#include "checkpoints/checkpoint.h"
#include "core/error.h"
#include "core/log.h"

namespace spotrain {

namespace {

// Rank 0: finds and loads the checkpoint; the header says what every rank needs of it.
ResumeHeader load_on_rank0(const RunConfig& cfg, Training& t, WeightEma* ema, std::string& path) {
  ResumeHeader h;
  path = cfg.resume == "auto" ? newest_good_checkpoint(cfg.ckpt_dir) : cfg.resume;
  if (path.empty()) return h;
  // The model first: another model's tensors would be refused one by one, less clearly.
  const std::string model = read_checkpoint_info(path).model;
  SPOTRAIN_CHECK(model == cfg.model, "checkpoint ", path, " is a ", model,
                 " checkpoint; this run trains ", cfg.model);
  CheckpointInfo ci = load_training_state(path, *t.model, *t.sgd);
  const TrainPosition at = position_of(ci);
  h.status = 1;
  h.step = at.step;
  h.epoch = at.epoch;
  h.batch_in_epoch = at.batch_in_epoch;
  h.world = ci.world_size > 0 ? ci.world_size : 1;
  h.global_batch = ci.global_batch > 0 ? ci.global_batch : cfg.batch_size * h.world;
  h.sgd_steps = t.sgd->steps();
  h.scaler = ci.scaler;
  if (ema && checkpoint_has_group(path, "ema")) {
    load_ema(path, *t.model, *ema);
    h.has_ema = 1;
  }
  return h;
}

}  // namespace

Resumed resume_training(const RunConfig& cfg, Session& session, Training& t, WeightEma* ema) {
  Resumed r;
  r.per_rank_batch = cfg.batch_size;
  if (cfg.resume == "none") return r;
  ResumeHeader h;
  std::string path, error;
  if (session.rank() == 0) {
    try {
      h = load_on_rank0(cfg, t, ema, path);
    } catch (const std::exception& e) {
      h.status = -1;
      error = e.what();
    }
  }
  if (session.world() > 1)
    session.worker().run("broadcast of the resume point",
                         [&] { session.comm().broadcast(&h, sizeof h, 0); });
  if (h.status < 0) {
    if (session.rank() == 0) throw Error(error);
    SPOTRAIN_THROW("rank 0 could not load the checkpoint to resume from (its error says why)");
  }
  if (h.status == 0) {
    log_info(str("--resume ", cfg.resume, ": no checkpoint in ", cfg.ckpt_dir,
                 "; starting from scratch"));
    return r;
  }
  const int64_t world = session.world();
  SPOTRAIN_CHECK(h.global_batch % world == 0, "the checkpoint was trained with a global batch of ",
                 h.global_batch, " on ", h.world, " rank(s); it does not divide over ", world,
                 " ranks. Resume on a rank count that divides ", h.global_batch);
  r.per_rank_batch = h.global_batch / world;
  if (r.per_rank_batch != cfg.batch_size)
    log_info(str("resuming a ", h.world, "-rank checkpoint on ", world, " rank(s): per-rank batch ",
                 r.per_rank_batch, " keeps its global batch of ", h.global_batch,
                 " (--batch-size ", cfg.batch_size, " is overridden)"));
  Model& model = *t.model;
  if (world > 1) {  // every rank continues from rank 0's state
    session.broadcast_from_rank0(model.flat_params(), "the checkpoint's parameters");
    session.broadcast_from_rank0(t.sgd->momentum(), "the checkpoint's momentum");
    session.broadcast_buffers(model);
    t.sgd->set_steps(h.sgd_steps);
  }
  if (ema && !h.has_ema) {  // a checkpoint from a run without the average: it starts here
    ema->restart();
    log_info("the checkpoint holds no moving average of the weights: --ema-decay starts from its weights");
  } else if (ema && world > 1) {
    session.broadcast_from_rank0(ema->params(), "the checkpoint's moving average");
    for (Tensor& b : ema->buffers()) session.broadcast_from_rank0(b, "the moving average's statistics");
  }
  t.scaler->set_state(h.scaler);
  r.resumed = true;
  r.at = TrainPosition{h.step, h.epoch, h.batch_in_epoch};
  r.checkpoint = path;
  log_info(str("resumed from ", session.rank() == 0 ? path : std::string("rank 0's checkpoint"),
               ": step ", r.at.step, ", epoch ", r.at.epoch + 1, ", batch ", r.at.batch_in_epoch));
  return r;
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
  metrics.write("resume", {{"step", r.at.step}, {"epoch", r.at.epoch + 1},
                           {"batch_in_epoch", r.at.batch_in_epoch}, {"checkpoint", r.checkpoint},
                           {"previous", after}, {"ranks", world}});
}

}  // namespace spotrain
