// Resume (--resume auto|PATH), in two halves around the building of the run's parts. First
// (find_resume_point) the rank holding the newest checkpoint (rank 0, or on node-local disks any
// writer of a copy) reads its record, and every rank learns where training goes on and the
// global batch it was trained at, so that the run's batch split (run_split: the same global
// batch over this run's ranks, run/global_batch.h) is final before the model, the step runner
// and the checkpoint writer are built from it. Then (load_resume_point) the holder loads the
// state and every rank gets it by broadcast (other nodes need no copy of the file):
// parameters, momentum, BN buffers, the moving average, the loss scaler.
#pragma once
#include <cstdint>
#include <string>

#include "checkpoints/training_record.h"
#include "engine/checkpoint_state.h"
#include "engine/ema.h"
#include "engine/session.h"
#include "observe/metrics.h"
#include "run/config.h"
#include "run/global_batch.h"
#include "run/storage.h"

namespace spotrain {

// Where a run starts: a checkpoint, as every rank knows it after find_resume_point.
struct ResumePoint {
  bool found = false;            // false: from scratch (--resume none, or auto with none found)
  int holder = 0;                // the rank whose checkpoint every rank takes
  std::string path;              // on the holder: the file ("" elsewhere)
  std::string checkpoint;        // for messages: the holder's path, elsewhere the file's name
  bool from_named_file = false;  // --resume PATH (not auto or latest)
  TrainPosition at;              // where training goes on
  int64_t global_batch = 0;      // what it was trained at, on `world` ranks
  int world = 0;
};

// Collective. Finds the checkpoint `cfg.resume` names: --resume PATH rank 0's file; --resume
// auto or latest the newest good checkpoint that any writer of `storage` holds in its folder.
// Its holder reads its record (refusing another model or optimizer). Throws Error on every
// rank when the holder cannot read it, when every copy of the run's checkpoints was lost, or
// with --resume latest when there is none (auto then starts from scratch).
ResumePoint find_resume_point(const RunConfig& cfg, Session& session, const RunStorage& storage);

// The batch split this run trains with: a fresh run's from --batch-size and --accum-steps; a
// resumed one's the checkpoint's global batch split evenly over this run's ranks with
// micro-batches of at most --batch-size (split_evenly; said in one line when the per-rank
// batch or micro-batches change). Throws Error naming the checkpoint where it does not split.
BatchSplit run_split(const RunConfig& cfg, const ResumePoint& p, int world);

// Collective. Loads the state of the checkpoint at `p` (found) into `t` (and `ema`, when
// given) on every rank; throws Error on every rank when the holder cannot.
void load_resume_point(const ResumePoint& p, Session& session, Training& t, WeightEma* ema);

// --init-from FILE, for a run that starts from scratch (not resumed): rank 0 loads the weights
// whose name and shape match (engine's load_matching_weights), every rank gets them by
// broadcast, and the moving average (--ema-decay) starts from them. The optimizer and the step
// stay fresh. Logs what was loaded and skipped; throws Error on every rank when rank 0 cannot.
void init_from_weights(const RunConfig& cfg, Session& session, Training& t, WeightEma* ema);

// The metrics' "resume" record: from which step and checkpoint, and how the previous process
// ended (from the last record it left: a stop, an end, or none, i.e. killed).
void record_resume(MetricsSink& metrics, const ResumePoint& r, int world);

}  // namespace spotrain
