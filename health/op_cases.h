// The op suite's cases, one set shared by the test suite (tests/test_backend_ops.cpp: each case
// a test per target) and `spotrain doctor` (each case on this machine's backends): every op of
// kernels/ops.h on a backend under test against the float64 reference (kernels/reference/),
// within kernels/op_tolerances.h's bounds, each result one OpCheck.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "kernels/op_tolerances.h"
#include "kernels/ops.h"

namespace spotrain::health {

// One backend under test: a device, the CPU's activation layout and a precision, whose
// tolerances kernels/op_tolerances.h holds.
struct OpTarget {
  const char* name;    // "blocked_fp32", "bf16", ...: the target in a check's line
  const char* device;  // "cpu" or "cuda"
  Layout layout;       // the CPU's activations (the GPU's are NHWC)
  DType dt;
  bool tf32;
  OpPrecision precision() const;
};
// The CPU as a backend under test: blocked at fp32 (the path CPU training takes), bf16 and
// fp16, NHWC at fp32, bf16 and fp16.
const std::vector<OpTarget>& cpu_op_targets();
// The CUDA backend: fp32, tf32, bf16, fp16.
const std::vector<OpTarget>& cuda_op_targets();

// The backend under test for t: its layout and TF32 mode, every new output poisoned (NaN
// bytes) so an element an op fails to write shows, wrapped so that a planted wrong op
// (SPOTRAIN_WRONG_OP) computes wrong. threads: 0 for all cores; autotune: whether a GPU times
// its kernels' candidates at first use (as training does by default; the doctor does not).
// Throws Error for "cuda" where there is none (cuda_backend_ready()).
std::unique_ptr<Backend> make_op_backend(const OpTarget& t, int threads = 0, bool autotune = true);
// Whether one backend made for `a` serves as the backend under test for `b` too: the same
// device, layout and TF32 mode (the precision is each op's dtype).
bool same_op_backend(const OpTarget& a, const OpTarget& b);
// The reference: the float64 backend (kernels/reference/); no planted wrong op reaches it.
std::unique_ptr<Backend> make_op_reference();

// One check of one case on one target: a normalized error within its limit, or an exact
// property (`exact`: holds or not, with what differed).
struct OpCheck {
  std::string op_case;  // the case that made it (OpCase::name)
  std::string target;   // OpTarget::name
  std::string what;     // the op and the quantity: "conv2d_backward_weights"
  std::string where;    // the shape and variant: "[2,16,9,9] k3 s2 p1 later-layer"
  double err = 0, limit = 0;
  bool exact = false, ok = true;
  std::string detail;  // an exact check's failure: what differed
  bool passed() const { return exact ? ok : err <= limit; }  // a NaN error fails
  // "fail  op conv2d_forward nhwc_fp32 [2,16,9,9] k3 s2 p1: normalized error 3.1e-01 > 1.0e-05"
  std::string line() const;
};

// A case's context: the backend under test, the reference, the target's dtype and tolerances,
// the helpers every case uses, and the checks it has made.
class OpCaseRun {
 public:
  OpCaseRun(Backend& be, Backend& ref, const OpTarget& t, std::string op_case = "");

  Backend* be() const { return &be_; }
  Backend* ref() const { return &ref_; }
  const OpTarget& target() const { return t_; }
  DType dt() const { return t_.dt; }
  // The normalized error allowed for `kind` at this target's precision (kernels/op_tolerances.h).
  double tol(OpKind kind) const { return op_tolerance(kind, t_.precision()); }
  bool on_gpu() const { return be_.device() == Device::cuda; }

  // An activation of host values h (NHWC), as an op in the middle of a network receives it:
  // on the backend under test in dt; on the reference the same values rounded to dt, in fp32.
  Tensor act(const Tensor& h);
  Tensor act_ref(const Tensor& h);
  // The normalized error of `got` (on the backend under test) against `want` (the reference).
  double err(const Tensor& got, const Tensor& want);
  // NaN into an output the op must overwrite (a parameter gradient).
  void poison(Tensor& t);

  // Records a check at the current scope: err <= limit; returns whether it passed.
  bool near(const std::string& what, double err, double limit);
  // near(what, err(got, want), tol(kind)): a result against the reference's.
  bool near(const std::string& what, const Tensor& got, const Tensor& want, OpKind kind);
  // Records an exact check; `detail` says what differed when it fails.
  bool expect(const std::string& what, bool ok, const std::string& detail = "");
  // Records that got == want element by element (as std::vector's ==).
  bool same(const std::string& what, const std::vector<float>& got, const std::vector<float>& want);

  // A scope: while it lives, each check's `where` ends with its text (a shape, a variant).
  class Scope {
   public:
    Scope(OpCaseRun& run, std::string where);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    OpCaseRun& run_;
    int uncaught_;
  };
  [[nodiscard]] Scope scope(std::string where) { return Scope(*this, std::move(where)); }
  std::string where() const;  // the scopes open now, joined by spaces
  // Where the case was when an exception left it (the innermost scope it unwound), or "".
  const std::string& thrown_where() const { return thrown_where_; }

  const std::vector<OpCheck>& checks() const { return checks_; }

 private:
  Backend& be_;
  Backend& ref_;
  OpTarget t_;
  OpCheck& add_check(const std::string& what);  // a new check at the current scope

  std::string case_;
  std::vector<std::string> scopes_;
  std::string thrown_where_;
  std::vector<OpCheck> checks_;
};

// One case: a name that reads as its specification, and its body.
struct OpCase {
  const char* name;
  void (*run)(OpCaseRun&);
};
// Every case, in the order of kernels/ops.h's sections.
const std::vector<OpCase>& op_cases();

// Runs one case on be against ref. An exception thrown inside it becomes one failed check
// naming the case, where it was and the message.
std::vector<OpCheck> run_op_case(const OpCase& c, Backend& be, Backend& ref, const OpTarget& t);
// Runs every case (or those whose name contains `filter`) in turn on be against ref; one
// case's failure or exception never stops the others.
std::vector<OpCheck> run_op_cases(Backend& be, Backend& ref, const OpTarget& t,
                                  const std::string& filter = "");

// ---- helpers for cases and tests -------------------------------------------------------------

// n normal values * scale + shift, from Philox(seed).
std::vector<float> normals(int64_t n, uint64_t seed, float scale = 1.f, float shift = 0.f);
// Host fp32 tensors: 4-D ones NHWC (the logical (N, C, H, W) filled from normals in memory
// order, which is all a random input needs), others plain.
Tensor host_nhwc(const Shape& s, uint64_t seed, float scale = 1.f);
Tensor host_plain(const Shape& s, uint64_t seed, float scale = 1.f, float shift = 0.f);
// Like host_nhwc, but channel c's values have a mean 3 to 5 standard deviations (`scale`) off
// zero, its sign random: a one-pass variance (E[x^2] - E[x]^2) or a sum that cancels loses
// its digits here where centred inputs hide it.
Tensor host_nhwc_shifted(const Shape& s, uint64_t seed, float scale = 1.f);
// Like host_nhwc, but no two elements of one (n, c) plane within 250 pixels of each other are
// equal, and all are exact in bf16 and fp16: max pooling then has no ties, whose gradient each
// backend may route differently.
Tensor host_nhwc_distinct(const Shape& s, uint64_t seed);
// The mean of each channel of a host NHWC fp32 tensor.
std::vector<double> channel_means(const Tensor& host_nhwc);
// Moves the mean of each output channel k of a convolution with host filter w (K, C, kh, kw)
// to out_mean[k], where its input's channel c has mean in_mean[c] (away from padded borders,
// where fewer taps read the input, the mean is that share of it): every tap of filter k
// answers the input means with out_mean[k] / taps, its answer to the deviations unchanged.
void shift_filter(Tensor& w, const std::vector<double>& in_mean, const std::vector<double>& out_mean);

// Any tensor's values in canonical order (4-D: NCHW), whatever its device and layout.
std::vector<float> values(Backend& be, const Tensor& t);
// ||got - want|| / ||want||; infinite when got has a NaN or inf where want has none (an
// unwritten, poisoned element) or the sizes differ.
double nerr(const std::vector<float>& got, const std::vector<float>& want);
// |got - want| / |want| of one number (infinite for a NaN got where want is finite).
double rel_err(double got, double want);
// A shape as a check's line writes it: "[2,16,9,9]".
std::string dims(const Shape& s);

// Batch-norm parameters and their gradients as unaligned views of one flat buffer, as in a
// Model: gamma and beta hold hg and hb.
struct BnParams {
  Tensor flat, gamma, beta, dgamma, dbeta;
};
BnParams bn_params(Backend& be, const Tensor& hg, const Tensor& hb);

}  // namespace spotrain::health
