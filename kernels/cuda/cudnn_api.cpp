// cudnn_library (see cudnn_api.h).
#include "kernels/cuda/cudnn_api.h"

#ifndef SPOTRAIN_CUDNN_PATH
#define SPOTRAIN_CUDNN_PATH ""
#endif

namespace spotrain::cuda {

DynLib& cudnn_library() {
  static DynLib lib("cuDNN 9", {SPOTRAIN_CUDNN_PATH, "libcudnn.so.9"});
  return lib;
}

}  // namespace spotrain::cuda
