// The planted wrong op of SPOTRAIN_WRONG_OP (core/environment.h), as a backend wrapped around
// the real one: every call forwards to it, and the Tensor returned by each op the hook names
// comes back doubled. Installed only where a test plants a fault (the Session's backend while
// the hook names an op, the op suite's backend under test), so no other run pays for it.
#pragma once
#include <memory>

#include "kernels/ops.h"

namespace spotrain {

// `inner` wrapped: the ops named by test_hooks().wrong_ops (read at each call, as the op
// profiler names them: conv2d_forward, upload_pixels, bn_relu+conv2d_forward+stats, ...)
// return twice their result; everything else is the inner backend's own.
std::unique_ptr<Backend> plant_wrong_ops(std::unique_ptr<Backend> inner);

// plant_wrong_ops(be) where the hook names an op now, else be itself.
std::unique_ptr<Backend> plant_wrong_ops_if_asked(std::unique_ptr<Backend> be);

}  // namespace spotrain
