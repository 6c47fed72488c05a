// Resume (--resume auto|PATH): the rank holding the newest checkpoint (rank 0, or on node-local
// disks any writer of a copy) loads it, then every rank gets the state by broadcast (other
// nodes need no copy of the file): parameters, momentum, BN buffers, the moving average, the
// loss scaler and the position in the data. A checkpoint from another rank count keeps its
// global batch (ranks x per-rank batch x --accum-steps): fewer ranks keep the per-rank batch and
// take more micro-batches per step, more ranks fewer (split_global_batch).
#pragma once
#include <cstdint>
#include <string>
#include <type_traits>

#include "checkpoints/training_record.h"
#include "engine/checkpoint_state.h"
#include "engine/ema.h"
#include "engine/session.h"
#include "observe/metrics.h"
#include "run/config.h"
#include "run/storage.h"

namespace spotrain {

// What rank 0 tells every rank after looking for the checkpoint to resume from.
struct ResumeHeader {
  int64_t status = 0;  // 0: none found, 1: loaded, -1: failed (rank 0 has the error)
  int64_t step = 0, epoch = 0, batch_in_epoch = 0;
  int64_t global_batch = 0, world = 0, sgd_steps = 0;
  int64_t has_ema = 0;  // rank 0 loaded the weights' moving average (--ema-decay)
  LossScalerState scaler;
};
static_assert(std::is_trivially_copyable<ResumeHeader>::value, "broadcast as bytes");

struct Resumed {
  bool resumed = false;        // false: no checkpoint (or --resume none): from scratch
  TrainPosition at;            // where training goes on
  std::string checkpoint;      // the file resumed from (the holder: its path; elsewhere its name)
  int holder = 0;              // the rank whose checkpoint every rank took
  bool from_named_file = false;  // --resume PATH (not auto or latest)
  // The checkpoint's global batch over this world: per_rank_batch x accum_steps per rank.
  int64_t per_rank_batch = 0;
  int accum_steps = 1;
};

// A global batch over a number of ranks: each rank's batch (micro-batch) and micro-batches per
// step; global batch = world x per_rank_batch x accum_steps.
struct BatchSplit {
  int64_t per_rank_batch = 0;
  int accum_steps = 1;
};

// How a checkpoint's global batch is trained on `world` ranks whose batch may not exceed
// `max_batch` (this run's --batch-size: what each rank's memory was sized for):
// - one micro-batch of global / world when that is at most max_batch (as many ranks as the run
//   had, or more: then the per-rank batch shrinks);
// - else micro-batches of max_batch, global / (world x max_batch) of them (fewer ranks: the
//   per-rank batch is kept and the micro-batches per step grow; 4 ranks x B shrunk to 2 is
//   2 ranks x B x 2, each micro-batch the batch of one of the 4).
// Throws Error naming the rank counts that would work when neither divides.
BatchSplit split_global_batch(int64_t global_batch, int64_t world, int64_t max_batch);

// Loads the state of the checkpoint `cfg.resume` names into `t` (and `ema`, when given) on
// every rank: --resume PATH rank 0's file; --resume auto or latest the newest good checkpoint
// that any writer of `storage` holds in its folder, broadcast by its holder. Throws Error on
// every rank when the holder cannot load it, when every copy of the run's checkpoints was
// lost, or with --resume latest when there is none (auto then starts from scratch).
Resumed resume_training(const RunConfig& cfg, Session& session, Training& t, WeightEma* ema,
                        const RunStorage& storage);

// --init-from FILE, for a run that starts from scratch (not resumed): rank 0 loads the weights
// whose name and shape match (engine's load_matching_weights), every rank gets them by
// broadcast, and the moving average (--ema-decay) starts from them. The optimizer and the step
// stay fresh. Logs what was loaded and skipped; throws Error on every rank when rank 0 cannot.
void init_from_weights(const RunConfig& cfg, Session& session, Training& t, WeightEma* ema);

// The metrics' "resume" record: from which step and checkpoint, and how the previous process
// ended (from the last record it left: a stop, an end, or none, i.e. killed).
void record_resume(MetricsSink& metrics, const Resumed& r, int world);

}  // namespace spotrain
