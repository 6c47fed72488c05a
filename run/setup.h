// The parts of a rank that `spotrain train` (the Trainer) and `spotrain bench` build alike,
// from one RunConfig: the session's options, the training spec, the loader's options, and the
// start-up check that every rank was given the same settings.
#pragma once

#include "engine/data.h"
#include "engine/session.h"
#include "io/loader.h"
#include "run/config.h"
#include "run/global_batch.h"

namespace spotrain {

SessionOptions session_options(const RunConfig& cfg);
// The model, optimizer, loss scaler, gradient sync and step runner a run of `cfg` trains on
// `rank`, for data of `num_classes` classes and `in_channels` channels; the step's
// micro-batches are `split`'s (run/global_batch.h).
TrainingSpec training_spec(const RunConfig& cfg, const BatchSplit& split, int rank, int num_classes,
                           int in_channels);
// The training loader over `data.train`: this rank's micro-batches of `split`, the run's
// augmentation, batches in the backend's staging memory (pinned on a GPU).
io::LoaderOptions loader_options(const RunConfig& cfg, const BatchSplit& split, const DataPair& data,
                                 Session& session);

// Several ranks: each setting not marked kPerNode (config.h) is hashed and compared with rank
// 0's; a difference throws naming the rank and the setting.
void check_ranks_agree(const RunConfig& cfg, Session& session);

}  // namespace spotrain
