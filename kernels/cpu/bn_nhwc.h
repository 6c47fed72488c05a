// Batch norm on bf16 NHWC activations with AVX-512: the layout oneDNN's AMX convolutions take
// (preferred_cpu_activations), where oneDNN 2.6's own NHWC batch norm took a third of a
// ResNet-50 step. Statistics in fp32 over N*H*W rows of C channels (the mean first, then the
// variance about it), the ReLU's mask made again from x in backward (no workspace).
// Internal to kernels/cpu/.
#pragma once
#include <cstdint>

namespace spotrain::cpu {

// Whether these kernels take a bf16 NHWC tensor of C channels on this processor.
bool bn_nhwc_bf16_usable(int64_t channels);

// mean and var (biased) of x (rows x c) per channel; then y = [relu](x * scale + shift [+ z])
// with scale = gamma / sqrt(var + eps), shift = beta - mean * scale (z: a residual, or null).
void bn_nhwc_bf16_forward_train(const uint16_t* x, const uint16_t* z, int64_t rows, int64_t c,
                                const float* gamma, const float* beta, float eps, bool relu,
                                uint16_t* y, float* mean, float* var);
// y = [relu]((x - mean) / sqrt(var + eps) * gamma + beta) with the given statistics.
void bn_nhwc_bf16_forward_infer(const uint16_t* x, int64_t rows, int64_t c, const float* gamma,
                                const float* beta, const float* mean, const float* var, float eps,
                                bool relu, uint16_t* y);
// Backward of bn_nhwc_bf16_forward_train (with relu: dy where the forward's output was
// positive): dx, dgamma, dbeta.
void bn_nhwc_bf16_backward(const uint16_t* dy, const uint16_t* x, int64_t rows, int64_t c,
                           const float* gamma, const float* beta, const float* mean,
                           const float* var, float eps, bool relu, uint16_t* dx, float* dgamma,
                           float* dbeta);

}  // namespace spotrain::cpu
