// MPI tests, run under mpirun with 2 and 4 ranks (see tests/CMakeLists.txt): collectives of
// the MPI Communicator, the Reducer's gradients against per-shard gradients computed in one
// process, and Trainer runs whose weights must end bitwise identical on every rank.
// Every rank runs every test; only rank 0 prints GoogleTest's output (other ranks print
// their failures only), and the exit code is non-zero when any rank failed.
// Rule for these tests: every rank makes the same collective calls in the same order, so
// assertions that could return early come only after the last collective of a test.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "comm/comm_worker.h"
#include "comm/communicator.h"
#include "comm/staged_comm.h"
#include "engine/grad_sync.h"
#include "core/error.h"
#include "engine/model.h"
#include "engine/optimizer.h"
#include "core/philox.h"
#include "engine/step.h"
#include "run/trainer.h"
#include "kernels/elementwise.h"
#include "kernels/ops.h"
#include "fmnist_resnet.h"
#include "layers/resnet.h"

using namespace spotrain;

namespace {

std::unique_ptr<Communicator> g_comm;

Communicator& comm() { return *g_comm; }

uint64_t fnv1a(const void* data, size_t bytes, uint64_t h = 1469598103934665603ull) {
  auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < bytes; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

uint64_t hash_tensor(Backend& be, const Tensor& t, uint64_t h = 1469598103934665603ull) {
  Tensor host = be.to_host(t);
  return fnv1a(host.raw(), size_t(host.numel()) * sizeof(float), h);
}

// Number of ranks whose value differs from rank 0's (after an allgather).
int ranks_differing(const std::vector<uint64_t>& all) {
  int n = 0;
  for (auto v : all) n += v != all[0];
  return n;
}

// ------------------------------------------------------------------ basics

TEST(MpiComm, RankSizeAndLauncher) {
  Communicator& c = comm();
  EXPECT_TRUE(launched_by_mpi());
  EXPECT_NE(c.name().find("mpi"), std::string::npos) << c.name();
  EXPECT_GE(c.size(), 1);
  EXPECT_GE(c.rank(), 0);
  EXPECT_LT(c.rank(), c.size());
  EXPECT_GE(c.local_rank(), 0);
  EXPECT_LT(c.local_rank(), c.size());
  if (const char* r = std::getenv("OMPI_COMM_WORLD_RANK")) {
    EXPECT_EQ(c.rank(), std::atoi(r));
  }
  if (const char* s = std::getenv("OMPI_COMM_WORLD_SIZE")) {
    EXPECT_EQ(c.size(), std::atoi(s));
  }
  // One node here: the local rank is the rank, and local ranks are distinct.
  if (const char* l = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK")) {
    EXPECT_EQ(c.local_rank(), std::atoi(l));
  }
  auto locals = c.allgather(uint64_t(c.local_rank()));
  std::sort(locals.begin(), locals.end());
  for (size_t i = 0; i < locals.size(); ++i) EXPECT_EQ(locals[i], i);
  c.barrier();
}

TEST(MpiComm, Allgather) {
  Communicator& c = comm();
  auto value = [](int r) { return 0x9E3779B97F4A7C15ull * uint64_t(r + 1) ^ (uint64_t(r) << 63); };
  auto all = c.allgather(value(c.rank()));
  ASSERT_EQ(int(all.size()), c.size());
  for (int r = 0; r < c.size(); ++r) EXPECT_EQ(all[size_t(r)], value(r)) << "rank " << r;
}

// Broadcast of an odd number of bytes from `root`: every rank ends with root's bytes.
void check_broadcast(int root, size_t bytes) {
  Communicator& c = comm();
  std::vector<uint8_t> want(bytes);
  Philox rng(99, uint32_t(root), uint32_t(bytes));
  for (auto& b : want) b = uint8_t(rng.next_u32() >> 24);
  std::vector<uint8_t> buf = c.rank() == root ? want : std::vector<uint8_t>(bytes, 0xAB);
  c.broadcast(buf.data(), bytes, root);
  size_t bad = 0, first = bytes;
  for (size_t i = 0; i < bytes; ++i)
    if (buf[i] != want[i]) {
      ++bad;
      first = std::min(first, i);
    }
  EXPECT_EQ(bad, 0u) << "root " << root << ", " << bytes << " bytes; first wrong byte " << first;
}

TEST(MpiComm, BroadcastFromFirstAndLastRank) {
  for (size_t bytes : {size_t(1), size_t(13), size_t(1 << 20) + 7}) {
    check_broadcast(0, bytes);
    check_broadcast(comm().size() - 1, bytes);
  }
}

// ------------------------------------------------- host-staged (ranks sharing a GPU)

// The MPI communicator, lent to a staged communicator that must not own (finalize) it.
class LentComm final : public Communicator {
 public:
  int rank() const override { return comm().rank(); }
  int size() const override { return comm().size(); }
  int local_rank() const override { return comm().local_rank(); }
  std::string name() const override { return comm().name(); }
  void allreduce_sum(void* d, int64_t n, DType t) override { comm().allreduce_sum(d, n, t); }
  void broadcast(void* d, size_t n, int root) override { comm().broadcast(d, n, root); }
  void barrier() override { comm().barrier(); }
  std::vector<uint64_t> allgather(uint64_t v) override { return comm().allgather(v); }
  [[noreturn]] void abort(int code) override {
    comm().abort(code);
    std::abort();  // not reached
  }
};

// "Device" memory is one registered host range; copies are memcpy.
class RangeStager final : public DeviceStager {
 public:
  RangeStager(const void* p, size_t n) : begin_(static_cast<const char*>(p)), n_(n) {}
  std::string name() const override { return "range"; }
  bool on_device(const void* p) override {
    auto* c = static_cast<const char*>(p);
    return c >= begin_ && c < begin_ + n_;
  }
  DeviceEvent* mark_compute() override { return nullptr; }
  void drop(DeviceEvent*) override {}
  void to_host(DeviceEvent*, const void* src, void* dst, size_t b) override { std::memcpy(dst, src, b); ++staged; }
  void to_device(const void* src, void* dst, size_t b) override { std::memcpy(dst, src, b); }
  void* staging(size_t b) override {
    if (buf_.size() < b) buf_.resize(b);
    return buf_.data();
  }
  int staged = 0;

 private:
  const char* begin_;
  size_t n_;
  std::vector<char> buf_;
};

// Over MPI, device buffers sum and broadcast as host buffers do, through the staging buffer.
TEST(StagedComm, SumsAndBroadcastsDeviceBuffersOverMpi) {
  const int64_t n = 100003;
  std::vector<float> dev(static_cast<size_t>(n));
  const int r = comm().rank(), w = comm().size();
  for (int64_t i = 0; i < n; ++i) dev[size_t(i)] = float((r + 1) * (i % 97));
  auto st = std::make_unique<RangeStager>(dev.data(), dev.size() * sizeof(float));
  RangeStager* stager = st.get();
  auto staged = make_staged_communicator(std::make_unique<LentComm>(), std::move(st));
  staged->allreduce_sum(dev.data(), n, DType::f32);
  const float ranks = float(w * (w + 1) / 2);
  int64_t bad = 0;
  for (int64_t i = 0; i < n; ++i) bad += dev[size_t(i)] != ranks * float(i % 97);
  EXPECT_EQ(bad, 0) << "elements not summed over the " << w << " ranks";
  EXPECT_EQ(stager->staged, 1);
  std::vector<float> mine(4, float(r));
  std::copy(mine.begin(), mine.end(), dev.begin());
  staged->broadcast(dev.data(), 4 * sizeof(float), w - 1);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(dev[size_t(i)], float(w - 1)) << "from the last rank";
  EXPECT_EQ(stager->staged, r == w - 1 ? 2 : 1) << "only the root stages what it broadcasts";
}

// ------------------------------------------------------------------ all-reduce

const int64_t kBucketPlusOne = int64_t(25) * (1 << 20) / 4 + 1;  // one past a 25 MiB bucket

class AllreduceExact : public ::testing::TestWithParam<int64_t> {};

// fp32 and int32 sums of small integers are exact whatever the reduction order.
TEST_P(AllreduceExact, F32AndI32) {
  Communicator& c = comm();
  const int64_t n = GetParam();
  const int W = c.size(), R = c.rank();
  auto val = [](int64_t i, int r) { return int32_t((i * 7 + r * 13) % 1024) - 512; };
  std::vector<float> f(static_cast<size_t>(n));
  std::vector<int32_t> k(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    f[size_t(i)] = float(val(i, R));
    k[size_t(i)] = val(i, R) * 4096 + R;
  }
  c.allreduce_sum(f.data(), n, DType::f32);
  c.allreduce_sum(k.data(), n, DType::i32);
  int64_t bad_f = 0, bad_k = 0, first_f = -1, first_k = -1;
  for (int64_t i = 0; i < n; ++i) {
    int64_t want = 0, want_k = 0;
    for (int r = 0; r < W; ++r) {
      want += val(i, r);
      want_k += int64_t(val(i, r)) * 4096 + r;
    }
    if (f[size_t(i)] != float(want) && bad_f++ == 0) first_f = i;
    if (k[size_t(i)] != want_k && bad_k++ == 0) first_k = i;
  }
  EXPECT_EQ(bad_f, 0) << "f32: first wrong element " << first_f << " of " << n;
  EXPECT_EQ(bad_k, 0) << "i32: first wrong element " << first_k << " of " << n;
}

INSTANTIATE_TEST_SUITE_P(Counts, AllreduceExact,
                         ::testing::Values(int64_t(1), int64_t(7), kBucketPlusOne,
                                           int64_t(10'000'000)));

struct Half16 {
  DType dtype;
  const char* name;
  uint16_t (*to)(float);
  float (*from)(uint16_t);
  double unit_roundoff;  // 2^-(mantissa bits + 1)
  double subnormal_step; // spacing of the smallest numbers (0: no subnormals worth noting)
};

const Half16 kBf16{DType::bf16, "bf16", float_to_bf16, bf16_to_float, 1.0 / 256, 0};
const Half16 kF16{DType::f16, "f16", float_to_half, half_to_float, 1.0 / 2048, 1.0 / (1 << 24)};

class Allreduce16 : public ::testing::TestWithParam<std::tuple<int, int64_t>> {};

// 16-bit sums: each step of the reduction rounds once, so the error is at most
// (W - 1) roundings of partial sums bounded by sum |v|.
TEST_P(Allreduce16, WithinRoundingOfTheExactSum) {
  Communicator& c = comm();
  const Half16& h = std::get<0>(GetParam()) == 0 ? kBf16 : kF16;
  const int64_t n = std::get<1>(GetParam());
  const int W = c.size(), R = c.rank();
  // Every rank draws every rank's inputs (fresh random values in (-4, 4), never zeros).
  std::vector<double> sum(size_t(n), 0.0), abs_sum(size_t(n), 0.0);
  std::vector<uint16_t> mine(static_cast<size_t>(n));
  for (int r = 0; r < W; ++r) {
    Philox rng(2025, uint32_t(r), uint32_t(h.dtype == DType::bf16));
    for (int64_t i = 0; i < n; ++i) {
      uint16_t v = h.to((rng.uniform() * 2.f - 1.f) * 4.f);
      if (r == R) mine[size_t(i)] = v;
      double d = h.from(v);
      sum[size_t(i)] += d;
      abs_sum[size_t(i)] += std::fabs(d);
    }
  }
  c.allreduce_sum(mine.data(), n, h.dtype);
  int64_t bad = 0, first = -1;
  double worst = 0;
  for (int64_t i = 0; i < n; ++i) {
    double got = h.from(mine[size_t(i)]);
    double tol = double(W) * (h.unit_roundoff * abs_sum[size_t(i)] + h.subnormal_step);
    double err = std::fabs(got - sum[size_t(i)]);
    if (!(err <= tol)) {
      if (bad++ == 0) first = i;
    }
    if (std::isfinite(err)) worst = std::max(worst, err / std::max(abs_sum[size_t(i)], 1e-30));
  }
  EXPECT_EQ(bad, 0) << h.name << ": first out-of-tolerance element " << first << " of " << n
                    << " (got " << (first >= 0 ? h.from(mine[size_t(first)]) : 0.f) << ", want "
                    << (first >= 0 ? sum[size_t(first)] : 0.0) << ")";
  // And the result is not just zeros: the worst relative error is a rounding, not 100%.
  EXPECT_LT(worst, 0.1) << h.name;
}

INSTANTIATE_TEST_SUITE_P(Counts, Allreduce16,
                         ::testing::Combine(::testing::Values(0, 1),
                                            ::testing::Values(int64_t(1), int64_t(7), kBucketPlusOne,
                                                              int64_t(10'000'000))),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param) == 0 ? "bf16_" : "f16_") +
                                  std::to_string(std::get<1>(info.param));
                         });

// ------------------------------------------------------------------ reduced gradients

std::vector<float> to_floats(Backend& be, const Tensor& t) {
  Tensor h = be.to_host(t);
  return std::vector<float>(h.data<float>(), h.data<float>() + h.numel());
}

// Shard s of a global batch of W * B deterministic inputs (fresh normals, random labels).
void make_shard(int s, int B, int H, Tensor& x, std::vector<int32_t>& labels) {
  x = Tensor::host({B, 1, H, H}, DType::f32, Layout::nhwc);
  labels.resize(size_t(B));
  float* p = x.data<float>();
  for (int b = 0; b < B; ++b) {
    int64_t sample = int64_t(s) * B + b;
    Philox rng(31337, uint32_t(sample), 7);
    for (int i = 0; i < H * H; ++i) p[int64_t(b) * H * H + i] = rng.normal();
    labels[size_t(b)] = int32_t(rng.below(10));
  }
}

// Forward (training) and backward of shard `s` on `m`, its gradients first set to NaN so that
// backward (and `listener`, a reducer, when given) must write every element.
void shard_backward(Model& m, Backend& be, int s, int B, int H, GradListener* listener = nullptr) {
  Tensor x;
  std::vector<int32_t> labels;
  make_shard(s, B, H, x, labels);
  Tensor logits = m.forward(be.upload_images(x), /*training=*/true);
  Tensor dl;
  be.softmax_xent(logits, labels.data(), 0.f, 1.f, &dl);
  be.fill(m.flat_grads(), std::numeric_limits<float>::quiet_NaN());
  m.backward(dl, listener);
}

struct GradCase {
  const char* name;
  std::string compression;
  double bucket_mb, first_bucket_mb;
  size_t min_buckets;  // resnet20 holds 1.04 MiB of fp32 gradients; its largest tensor 0.14 MiB
};

void PrintTo(const GradCase& c, std::ostream* os) { *os << c.name; }

class ReducedGradients : public ::testing::TestWithParam<GradCase> {};

// Every rank computes its shard's gradients with a Reducer (all-reduce SUM during backward,
// then / W as StepRunner does) and compares with the average of all shards' gradients it
// computes itself, shard by shard (BN statistics per shard, as in data parallelism).
TEST_P(ReducedGradients, EqualAverageOfPerShardGradients) {
  const GradCase& gc = GetParam();
  Communicator& c = comm();
  const int W = c.size(), R = c.rank();
  const int B = 4, H = 12;
  auto be = make_backend("cpu", BackendOptions{1, false});
  Model m(build_resnet(fmnist_resnet20()), *be);
  m.initialize(2024);
  const int64_t P = m.num_params();
  // Same seed, same weights on every rank.
  auto init_hashes = c.allgather(hash_tensor(*be, m.flat_params()));

  // Reference: each shard's forward/backward in turn, in this process.
  std::vector<double> ref(size_t(P), 0.0), abs_sum(size_t(P), 0.0);
  for (int s = 0; s < W; ++s) {
    shard_backward(m, *be, s, B, H);
    auto g = to_floats(*be, m.flat_grads());
    for (int64_t i = 0; i < P; ++i) {
      ref[size_t(i)] += double(g[size_t(i)]) / W;
      abs_sum[size_t(i)] += std::fabs(double(g[size_t(i)]));
    }
  }

  // Distributed: this rank's shard, reduced over ranks while backward runs. Twice, to check
  // the Reducer resets between steps.
  CommWorker worker(c, 120);
  ReducerOptions opt;
  opt.bucket_mb = gc.bucket_mb;
  opt.first_bucket_mb = gc.first_bucket_mb;
  opt.compression = gc.compression;
  GradSync red(m, worker, opt);
  std::vector<std::vector<float>> got(2);
  for (int it = 0; it < 2; ++it) {
    shard_backward(m, *be, R, B, H, &red);
    red.finish();
    got[size_t(it)] = to_floats(*be, m.flat_grads());
    for (auto& v : got[size_t(it)]) v /= float(W);
  }
  auto got_hashes = c.allgather(fnv1a(got[0].data(), got[0].size() * sizeof(float)));

  // --- checks (no collectives below) ---
  EXPECT_EQ(ranks_differing(init_hashes), 0) << "ranks started from different weights";
  EXPECT_EQ(ranks_differing(got_hashes), 0) << "ranks hold different reduced gradients";
  EXPECT_GE(red.num_buckets(), gc.min_buckets)
      << "--bucket-mb " << gc.bucket_mb << " (first bucket " << gc.first_bucket_mb << " MB)";
  EXPECT_EQ(std::memcmp(got[0].data(), got[1].data(), got[0].size() * sizeof(float)), 0)
      << "a second step with the same Reducer gave different gradients";
  // Tolerances from error bounds: fp32 summation order; 16-bit: the rounding of each
  // pre-divided shard gradient plus W - 1 rounded partial sums (all bounded by sum |g|),
  // and fp16's subnormal spacing.
  // fp32: |error| <= (W - 1) 2^-24 sum |g| / W, checked at 1e-5 of the mean |g|.
  double u = 1e-5 / W, atol = 0;
  if (gc.compression == "bf16") u = 1.5 / 256;
  if (gc.compression == "fp16") {
    u = 1.5 / 2048;
    atol = 2.0 * W / (1 << 24);
  }
  int64_t bad = 0, first = -1;
  double worst_rel = 0;
  int64_t nonzero = 0;
  for (int64_t i = 0; i < P; ++i) {
    double g = got[0][size_t(i)], r = ref[size_t(i)];
    double err = std::fabs(g - r), tol = u * abs_sum[size_t(i)] + atol;
    if (!(err <= tol) && bad++ == 0) first = i;
    if (abs_sum[size_t(i)] > 0) worst_rel = std::max(worst_rel, err / abs_sum[size_t(i)]);
    nonzero += r != 0;
  }
  EXPECT_GT(nonzero, P / 2) << "gradients mostly zero: the check would prove little";
  EXPECT_EQ(bad, 0) << gc.name << ": " << bad << " of " << P
                    << " gradient elements outside tolerance; first at flat offset " << first
                    << ": got " << (first >= 0 ? got[0][size_t(first)] : 0.f) << " want "
                    << (first >= 0 ? ref[size_t(first)] : 0.0) << " (sum |g| "
                    << (first >= 0 ? abs_sum[size_t(first)] : 0.0) << ")";
  if (gc.compression == "none") {
    EXPECT_LT(worst_rel * W, 1e-5) << "relative to the mean |g|";
  }
  RecordProperty("worst_error_over_sum_abs", std::to_string(worst_rel));
}

INSTANTIATE_TEST_SUITE_P(
    Cases, ReducedGradients,
    ::testing::Values(GradCase{"fp32_default_buckets", "none", 25, 1, 2},
                      GradCase{"fp32_small_buckets", "none", 0.1, 0.05, 8},
                      // --bucket-mb below the default 1 MB first bucket: no bucket may
                      // exceed --bucket-mb (+ one tensor), so at least 3 buckets.
                      GradCase{"fp32_buckets_below_first_bucket", "none", 0.25, 1, 3},
                      GradCase{"fp16_small_buckets", "fp16", 0.1, 0.05, 8},
                      GradCase{"bf16_default_buckets", "bf16", 25, 1, 2}),
    [](const auto& info) { return std::string(info.param.name); });

// StepRunner with a Reducer: one SGD step (lr 1, no momentum, no weight decay) moves the
// weights by exactly the average of the shards' gradients, also through the fp16 loss-scale
// path (unscale by 1 / (scale * world)) and in bf16 compute. The reference runs each shard
// in the same compute dtype in this process.
class StepRunnerRanks : public ::testing::TestWithParam<std::string> {};  // --precision

TEST_P(StepRunnerRanks, OneStepAppliesTheAverageGradient) {
  Communicator& c = comm();
  const int W = c.size(), R = c.rank();
  const int B = 4, H = 12;
  const Precision prec = parse_precision(GetParam());
  const DType dt = compute_dtype(prec);
  const double S = prec == Precision::fp16 ? 1024.0 : 1.0;  // static loss scale
  auto be = make_backend("cpu", BackendOptions{1, false});
  ResNetOptions ro;
  ro.arch = "resnet20";
  Model m(build_resnet(ro), *be);
  m.initialize(77);
  const int64_t P = m.num_params();
  std::vector<double> ref(size_t(P), 0.0), abs_sum(size_t(P), 0.0);
  for (int s = 0; s < W; ++s) {
    Tensor x;
    std::vector<int32_t> labels;
    make_shard(s, B, H, x, labels);
    Tensor logits = m.forward(be->upload_images(x, dt), true);
    Tensor dl;
    be->softmax_xent(logits, labels.data(), 0.f, float(S), &dl);
    m.backward(dl);
    auto g = to_floats(*be, m.flat_grads());
    for (int64_t i = 0; i < P; ++i) {
      ref[size_t(i)] += double(g[size_t(i)]) / S / W;
      abs_sum[size_t(i)] += std::fabs(double(g[size_t(i)])) / S;
    }
  }
  auto before = to_floats(*be, m.flat_params());

  CommWorker worker(c, 120);
  GradSync red(m, worker, ReducerOptions{0.25, 0.05, "none"});
  SgdOptions so;
  so.momentum = 0;
  so.weight_decay = 0;
  Sgd sgd(m, so);
  LossScalerOptions lso;
  lso.enabled = prec == Precision::fp16;
  lso.static_scale = S;
  LossScaler scaler(lso);
  StepRunner runner(m, sgd, scaler, prec, &red, W);
  Tensor x;
  std::vector<int32_t> labels;
  make_shard(R, B, H, x, labels);
  StepResult sr = runner.run(x, labels.data(), /*lr=*/1.f, 0.f);
  auto after = to_floats(*be, m.flat_params());
  auto hashes = c.allgather(fnv1a(after.data(), after.size() * sizeof(float)));

  EXPECT_EQ(ranks_differing(hashes), 0) << "weights differ between ranks after one step";
  EXPECT_FALSE(sr.overflow);
  int64_t bad = 0, first = -1;
  for (int64_t i = 0; i < P; ++i) {
    double step = double(before[size_t(i)]) - double(after[size_t(i)]);
    double tol = 1e-5 * abs_sum[size_t(i)] / W +
                 2.0 / (1 << 24) * (std::fabs(before[size_t(i)]) + std::fabs(after[size_t(i)]));
    if (!(std::fabs(step - ref[size_t(i)]) <= tol) && bad++ == 0) first = i;
  }
  EXPECT_EQ(bad, 0) << GetParam() << ": " << bad << " of " << P
                    << " weights moved by other than the average gradient; first at " << first
                    << ": moved " << (first >= 0 ? before[size_t(first)] - after[size_t(first)] : 0.f)
                    << ", average gradient " << (first >= 0 ? ref[size_t(first)] : 0.0);
}

INSTANTIATE_TEST_SUITE_P(Precisions, StepRunnerRanks, ::testing::Values("fp32", "fp16", "bf16"));

// ------------------------------------------------------------------ Trainer

class TrainerRanks : public ::testing::TestWithParam<std::string> {};  // --grad-compression

// After a few data-parallel steps every rank holds bitwise the same weights and BN
// statistics, and the split evaluation gives every rank the whole test set's figures.
TEST_P(TrainerRanks, WeightsBitwiseIdenticalAfterSteps) {
  Communicator& c = comm();
  RunConfig cfg;
  cfg.model = "resnet20";
  cfg.data = "synthetic";
  cfg.train_limit = 256;
  cfg.test_limit = 60;  // not a multiple of 4 ranks: the eval split is uneven
  cfg.steps = 6;
  cfg.batch_size = 8;
  cfg.log_every = 1000;
  cfg.device = "cpu";
  cfg.threads = 1;
  cfg.eval_each_epoch = false;
  cfg.ckpt_dir = "";
  cfg.bucket_mb = 0.25;  // several buckets
  cfg.grad_compression = GetParam();
  cfg.comm_timeout = 120;
  Trainer t(cfg);
  TrainResult res = t.run();
  Backend& be = t.backend();
  uint64_t h_params = hash_tensor(be, t.model().flat_params());
  uint64_t h_buf = 1469598103934665603ull;
  for (auto* b : t.model().buffers()) h_buf = hash_tensor(be, b->value, h_buf);
  auto params = c.allgather(h_params);
  auto buffers = c.allgather(h_buf);
  uint64_t top1_bits;
  std::memcpy(&top1_bits, &res.test.top1, sizeof top1_bits);
  auto top1 = c.allgather(top1_bits);
  auto samples = c.allgather(uint64_t(res.test.samples));

  EXPECT_EQ(res.steps, 6);
  EXPECT_EQ(ranks_differing(params), 0) << "weights differ between ranks";
  EXPECT_EQ(ranks_differing(buffers), 0) << "BN statistics differ between ranks";
  EXPECT_EQ(ranks_differing(top1), 0) << "ranks report different test accuracy";
  for (auto s : samples) EXPECT_EQ(s, 60u) << "split evaluation must count the whole test set";
  // Training changed the weights (the comparison above is not between untouched inits).
  auto fresh_be = make_backend("cpu", BackendOptions{1, false});
  ResNetOptions ro;
  ro.arch = cfg.model;
  ro.in_channels = 1;
  ro.num_classes = 10;
  Model fresh(build_resnet(ro), *fresh_be);
  fresh.initialize(cfg.seed);
  EXPECT_NE(hash_tensor(*fresh_be, fresh.flat_params()), h_params);
}

INSTANTIATE_TEST_SUITE_P(Compression, TrainerRanks, ::testing::Values("none", "fp16", "bf16"));

// Other ranks print only their failures, prefixed with the rank.
class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (!r.failed()) return;
    std::fprintf(stderr, "[rank %d] %s:%d: Failure\n%s\n", rank_,
                 r.file_name() ? r.file_name() : "?", r.line_number(), r.message());
    std::fflush(stderr);
  }
  void OnTestEnd(const ::testing::TestInfo& t) override {
    if (t.result()->Failed())
      std::fprintf(stderr, "[rank %d] FAILED %s.%s\n", rank_, t.test_suite_name(), t.name());
  }

 private:
  int rank_;
};

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  g_comm = make_communicator("mpi");
  const int rank = g_comm->rank();
  auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
  if (rank != 0) {
    delete listeners.Release(listeners.default_result_printer());
    delete listeners.Release(listeners.default_xml_generator());
    listeners.Append(new RankFailurePrinter(rank));
  }
  int rc = RUN_ALL_TESTS();
  int32_t failed = rc != 0;
  g_comm->allreduce_sum(&failed, 1, DType::i32);
  if (rank == 0) {
    if (failed)
      std::fprintf(stderr, "test_mpi: %d of %d ranks failed\n", failed, g_comm->size());
    else
      std::printf("test_mpi: all %d ranks passed\n", g_comm->size());
  }
  std::fflush(stdout);
  std::fflush(stderr);
  g_comm.reset();  // MPI_Finalize
  return failed ? 1 : 0;
}
