// nccl_library (see nccl_api.h).
#include "comm/nccl_api.h"

#ifndef SPOTRAIN_NCCL_PATH
#define SPOTRAIN_NCCL_PATH ""
#endif

namespace spotrain {

DynLib& nccl_library() {
  static DynLib lib("NCCL 2", {SPOTRAIN_NCCL_PATH, "libnccl.so.2"});
  return lib;
}

}  // namespace spotrain
