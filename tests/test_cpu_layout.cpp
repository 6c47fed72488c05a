// The CPU backend's blocked layout follows the processor (kernels/cpu/blocked.h): oneDNN runs
// its own kernels on it, never its reference code (hundreds of times slower, which nChw16c
// gets on a processor without AVX-512), and bf16 is computed by oneDNN only with AVX-512.
#include <gtest/gtest.h>

#include <string>

#include "core/environment.h"
#include "kernels/cpu/dnnl_util.h"
#include "kernels/ops.h"

namespace {

using dnnl::memory;

bool processor_has_avx512_core() {
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
}

memory::desc act(memory::dims d, memory::data_type dt = memory::data_type::f32) {
  return memory::desc(d, dt, spotrain::cpu::blocked_tag());
}

}  // namespace

TEST(CpuLayout, BlockWidthFollowsTheProcessor) {
  EXPECT_EQ(spotrain::cpu_block_channels(), processor_has_avx512_core() ? 16 : 8);
  EXPECT_EQ(spotrain::cpu_padded_channels(20), processor_has_avx512_core() ? 32 : 24);
  EXPECT_EQ(spotrain::cpu::via_f32(spotrain::DType::bf16), !processor_has_avx512_core());
  EXPECT_TRUE(spotrain::cpu::via_f32(spotrain::DType::f16));
  EXPECT_FALSE(spotrain::cpu::via_f32(spotrain::DType::f32));
}

TEST(CpuLayout, OneDnnRunsItsOwnKernelsOnTheBlockedLayout) {
  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  const auto f32 = memory::data_type::f32;
  const memory::dims x{4, 32, 14, 14};
  // Convolution forward, 3x3, the layout in and out (weights in oneDNN's choice), batch norm
  // (training, with scale and shift) and max pooling.
  auto conv = spotrain::cpu::conv_fwd_pd(eng, act(x),
                                         memory::desc({32, 32, 3, 3}, f32, memory::format_tag::any),
                                         act(x), {1, 1}, {1, 1});
  auto bn = spotrain::cpu::bn_fwd_pd(
      eng, dnnl::prop_kind::forward_training, act(x), 1e-5f,
      dnnl::normalization_flags::use_scale | dnnl::normalization_flags::use_shift);
  auto pool = spotrain::cpu::maxpool_fwd_pd(eng, act(x), act({4, 32, 7, 7}), {2, 2}, {2, 2}, {0, 0});
  for (const std::string impl : {conv.impl_info_str(), bn.impl_info_str(), pool.impl_info_str()})
    EXPECT_EQ(impl.find("ref"), std::string::npos)
        << "oneDNN's reference code (" << impl << ") on the " << spotrain::cpu_block_channels()
        << "-channel blocked layout";
}

// bf16 runs NHWC where oneDNN has AMX (its AMX convolutions take no other layout; blocked ran
// bf16 ResNet-50 at 0.4x the speed there), everything else the blocked layout; the variable
// SPOTRAIN_CPU_LAYOUT overrides it, and a value it does not know is an error.
TEST(CpuLayout, Bf16TakesNhwcExactlyWhereOneDnnHasAmx) {
  using spotrain::DType;
  using spotrain::Layout;
  std::string& hook = spotrain::test_hooks_for_test().cpu_layout;  // SPOTRAIN_CPU_LAYOUT
  hook = "";
  EXPECT_EQ(spotrain::preferred_cpu_activations(DType::f32), Layout::blocked);
  EXPECT_EQ(spotrain::preferred_cpu_activations(DType::f16), Layout::blocked);
  EXPECT_EQ(spotrain::preferred_cpu_activations(DType::bf16),
            spotrain::cpu_amx_bf16() ? Layout::nhwc : Layout::blocked);
  if (spotrain::cpu_amx_bf16()) {
    EXPECT_TRUE(spotrain::cpu_avx512());
  }
  hook = "nhwc";
  EXPECT_EQ(spotrain::preferred_cpu_activations(DType::f32), Layout::nhwc);
  hook = "blocked";
  EXPECT_EQ(spotrain::preferred_cpu_activations(DType::bf16), Layout::blocked);
  hook = "nchw16c";
  EXPECT_THROW(spotrain::preferred_cpu_activations(DType::bf16), spotrain::Error);
  hook = "";
}
