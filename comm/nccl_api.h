// NCCL, opened when the first NCCL communicator is made rather than linked (nccl_library() of
// core/dynlib.h):
// a CUDA build starts on machines without NCCL. The NCCL functions the communicator calls are
// declared here, in namespace spotrain, under NCCL's own names and signatures. Internal to
// comm/ (CUDA builds).
#pragma once
#include <nccl.h>

#include "core/dynlib.h"

namespace spotrain {

#define SPOTRAIN_NCCL(fn) SPOTRAIN_DYN_FN(nccl_library, fn)
SPOTRAIN_NCCL(ncclGetVersion);
SPOTRAIN_NCCL(ncclGetErrorString);
SPOTRAIN_NCCL(ncclGetLastError);
SPOTRAIN_NCCL(ncclGetUniqueId);
SPOTRAIN_NCCL(ncclCommInitRank);
SPOTRAIN_NCCL(ncclCommDestroy);
SPOTRAIN_NCCL(ncclCommAbort);
SPOTRAIN_NCCL(ncclCommGetAsyncError);
SPOTRAIN_NCCL(ncclAllReduce);
SPOTRAIN_NCCL(ncclBroadcast);
#undef SPOTRAIN_NCCL

}  // namespace spotrain
