// fusion_mode, choose_fusion and their helpers (see fusion_choice.h).
#include "engine/fusion_choice.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>

#include "core/clock.h"
#include "core/log.h"
#include "kernels/op_profiler.h"
#include "kernels/kernel_cache.h"
#include "layers/fusion_chain.h"

namespace spotrain {

FusionMode fusion_mode(const std::string& setting, const Backend& be, DType compute) {
  FusionMode p;
  if (setting == "none") return p;
  if (setting == "bn") {
    p.links = p.on = true;
    return p;
  }
  SPOTRAIN_CHECK(setting == "auto", "unknown --fusion '", setting, "'; use auto, bn or none");
  p.links = true;
  p.choose = be.fuses_conv_bn(compute);
  return p;
}

namespace {

// A chain's verdict in the kernel cache: "fusion " + FusionChain::shape_key, choice "fused" or
// "apart", ms the chosen way's time, the runner-up the other way's.
const char* const kCacheKey = "fusion ";

// Milliseconds one run takes on the device: between two marks of the device clock, or on the
// host around ops that compute as they are called (the CPU, where queueing costs nothing
// apart from computing).
double time_ms(Backend& be, const std::function<void()>& run) {
  DeviceClock* clock = be.device_clock();
  if (!clock) {
    const double t0 = now_seconds();
    run();
    be.synchronize();
    return 1e3 * (now_seconds() - t0);
  }
  // Training replays captured steps, which do not pay the host's cost of queueing an op
  // (cuDNN's argument packs, memsets, launches) again; these runs do. With the device idle at
  // the first mark, all that the host does to queue a run would land between the marks, and
  // the 2% margin could be decided by host time (which favours the way with fewer ops). So one
  // run first fills the queue, and kFusionRunsPerMark runs follow back to back: while the
  // device works through one, the host queues the next, and the marks time the device's work.
  // (Where the host queues a run slower than the device computes it, the chain is bound by
  // launches both ways, and a captured step runs it faster than either time says.)
  run();
  clock->record_mark();
  for (int i = 0; i < kFusionRunsPerMark; ++i) run();
  clock->record_mark();
  return clock->read_marks_ms().back() / kFusionRunsPerMark;
}

// One chain shape, timed (or its verdict taken from the cache) and checked.
struct Trial {
  FusionVerdict v;
  // The check: "" where the fused run computed what the layers apart did, else what differed.
  std::string difference;
  double worst = 0;        // the largest normalized difference found, as a share of its bound
  bool unjudged = false;   // the run apart gave inf or NaN: neither checked nor kept
};

bool all_finite(const Tensor& host) {
  const float* p = host.data<float>();
  for (int64_t i = 0; i < host.numel(); ++i)
    if (!std::isfinite(p[i])) return false;
  return true;
}

// The fused run's tensors against those of the run apart, each within the bound of the fused
// op that makes it (fast_path_tolerance).
void check(Backend& be, const FusionChain& chain, const std::vector<FusionChain::Outcome>& fused,
           const std::vector<FusionChain::Outcome>& apart, OpPrecision precision, Trial& t) {
  double worst_over_tol = -1;
  for (size_t i = 0; i < apart.size(); ++i) {
    const Tensor want = be.to_host(apart[i].t);
    if (!all_finite(want)) {
      t.unjudged = true;
      return;
    }
    const double e = normalized_difference(be.to_host(fused[i].t), want);
    const double tol = fast_path_tolerance(apart[i].kind, precision);
    t.worst = std::max(t.worst, e / tol);
    if (!(e <= tol) && (std::isnan(e) || e / tol > worst_over_tol)) {
      worst_over_tol = std::isnan(e) ? std::numeric_limits<double>::infinity() : e / tol;
      t.difference = str("that ", chain.name(), " fused differs from its layers apart in ",
                         apart[i].what, " by a normalized difference of ", fmt_sci(e),
                         " (allowed ", fmt_sci(tol), ")");
    }
  }
}

// Both ways once (the first run of a shape chooses its kernels), then, unless the cache has
// the verdict, three rounds alternating, each timing kFusionRunsPerMark runs a way; the best
// round of each. The last run each way is the one the check compares: the check is of the
// kernels the timing ran, on the chain's real input.
Trial try_chain(Backend& be, FusionChain& chain, const Tensor& x, const TuneVerdict* cached,
                OpPrecision precision) {
  FusionChain::Scratch apart_s = chain.make_scratch(be), fused_s = chain.make_scratch(be);
  FusionChain::Result apart, fused;
  auto run_apart = [&] { apart = chain.run(be, x, false, apart_s); };
  auto run_fused = [&] { fused = chain.run(be, x, true, fused_s); };
  run_apart();
  run_fused();
  Trial t;
  if (cached) {
    t.v.fused = cached->choice == "fused";
    t.v.cached = true;
    t.v.fused_ms = t.v.fused ? cached->ms : cached->runner_up_ms;
    t.v.apart_ms = t.v.fused ? cached->runner_up_ms : cached->ms;
  } else {
    t.v.apart_ms = t.v.fused_ms = std::numeric_limits<double>::infinity();
    for (int round = 0; round < 3; ++round) {
      t.v.apart_ms = std::min(t.v.apart_ms, time_ms(be, run_apart));
      t.v.fused_ms = std::min(t.v.fused_ms, time_ms(be, run_fused));
    }
    t.v.fused = t.v.fused_ms <= kFusionWinsBelow * t.v.apart_ms;
  }
  check(be, chain, chain.outcome(fused, fused_s), chain.outcome(apart, apart_s), precision, t);
  return t;
}

}  // namespace

std::vector<FusionVerdict> choose_fusion(Model& model, const Tensor& x, FastPathChecks* checks,
                                         CommWorker* ranks) {
  Backend& be = model.backend();
  std::vector<FusionChain> chains = fusion_chains(model.net());
  if (chains.empty()) return {};
  // The scratch forward runs every chain apart (each run switches its chain as it asks, and
  // back); the verdicts are switched on once the ranks agree.
  set_fusion(model, false);
  std::vector<FusionVerdict> out(chains.size());
  std::vector<std::string> keys(chains.size());  // each judged chain's shape, to keep ("" otherwise)
  std::vector<bool> timed(chains.size(), false);  // its verdict timed in this run
  std::string cannot;  // why this rank cannot run fused chains ("" where it can)
  if (checks && checks->off(kFastPathFusion)) {
    cannot = str("a first-use check found the fused chains wrong on this device (",
                 checks->why_off(kFastPathFusion), ")");
    log_info(str("--fusion auto: every chain runs apart, untimed: ", cannot));
  } else {
    std::map<const Layer*, size_t> head;  // a chain's first convolution -> the chain
    for (size_t i = 0; i < chains.size(); ++i) head[&chains[i].head()] = i;
    KernelCache* cache = be.kernel_cache();
    const OpPrecision precision = op_precision(x.dtype(), false, be.device() == Device::cuda);
    std::map<std::string, Trial> by_shape;  // chains of one shape are timed and checked once
    std::string failure;  // the first check that failed
    double worst = 0;
    // The device clock's marks are the op profiler's too: its pending ones are read into
    // durations first, and it is detached while the chains are timed.
    OpProfiler* prof = be.profiler();
    if (prof) {
      prof->resolve_pending();
      be.set_profiler(nullptr);
    }
    try {
      // A training forward (batch statistics, as the first step's), not an evaluation one:
      // before the first step the running statistics are their initial 0 and 1, which
      // normalize nothing, and the deep stages' activations grow with depth until fp16 ones
      // overflow; timed and checked on inf or NaN, the verdicts would be worthless.
      model.forward_probed(x, [&](Layer& l, const Tensor& in) {
        auto it = head.find(&l);
        if (it == head.end() || !failure.empty()) return;
        FusionChain& c = chains[it->second];
        const std::string key = c.shape_key(in);
        auto known = by_shape.find(key);
        Trial t;
        if (known != by_shape.end()) {
          t = known->second;
        } else {
          const TuneVerdict* hit = cache ? cache->find(kCacheKey + key) : nullptr;
          t = try_chain(be, c, in, hit, precision);
          // Timed where the fused graphs may have been planned past the backend's budget,
          // their first engine untimed (every graph planned before the cut was timed).
          t.v.provisional = !t.v.cached && be.kernel_timing_cut();
          // A shape met with inf or NaN is tried again where it comes next.
          if (!t.unjudged) by_shape.emplace(key, t);
          if (!t.difference.empty()) failure = t.difference;
          worst = std::max(worst, t.worst);
        }
        out[it->second] = t.v;
        out[it->second].chain = c.name();
        if (t.unjudged) {
          out[it->second].fused = false;
          return;
        }
        if (!t.v.provisional) keys[it->second] = key;  // else not kept
        timed[it->second] = !t.v.cached;
      });
    } catch (const std::exception& e) {
      // Training does not depend on the choice: it goes on with every chain apart.
      be.set_profiler(prof);
      cannot = str("timing the chains failed (", e.what(), ")");
      log_info(str("warning: --fusion auto: ", cannot, "; every chain runs apart"));
    }
    be.set_profiler(prof);
    if (cannot.empty() && !failure.empty()) {
      cannot = "its first-use check failed";
      const std::string what = failure + "; every chain runs apart";
      if (checks) checks->failed(kFastPathFusion, what);
      else log_info(str("warning: --fusion auto: the first-use check found ", what));
    } else if (cannot.empty() && checks && !by_shape.empty()) {
      checks->passed(kFastPathFusion, str("the largest normalized difference at ", fmt_fixed(100 * worst, 1),
                                          "% of its bound (", op_precision_name(precision),
                                          ", twice the op suite's) over ", by_shape.size(), " chain shapes"));
    }
  }

  // Every rank runs rank 0's verdicts (the same computation, and under --grad-checkpoint
  // selective the same memory, on every rank), or every chain apart where any rank cannot.
  std::vector<uint8_t> on(chains.size());
  for (size_t i = 0; i < chains.size(); ++i) on[i] = out[i].fused ? 1 : 0;
  bool apart = !cannot.empty();
  if (ranks && ranks->comm().size() > 1) {
    Communicator& comm = ranks->comm();
    std::vector<uint64_t> flags;
    ranks->run("all-gather of whether each rank can fuse (--fusion auto)",
               [&] { flags = comm.allgather(cannot.empty() ? 0 : 1); });
    ranks->run("broadcast of rank 0's fused chains (--fusion auto)",
               [&] { comm.broadcast(on.data(), on.size(), 0); });
    std::string who;
    for (size_t r = 0; r < flags.size(); ++r)
      if (flags[r]) who += (who.empty() ? "" : ", ") + std::to_string(r);
    if (!who.empty() && !apart) {
      log_info(str("--fusion auto: every chain runs apart: rank ", who,
                   " cannot run them fused (its warning says why)"));
      apart = true;
    }
  }
  if (apart) {
    set_fusion(model, false);
    return {};
  }
  KernelCache* cache = be.kernel_cache();
  for (size_t i = 0; i < chains.size(); ++i) {
    out[i].fused = on[i] != 0;
    chains[i].set_fused(out[i].fused);
    // Kept as agreed (restarts, and every rank that reads this cache, run the same chains);
    // written with the kernel choices after the step (Backend::save_kernel_choices).
    if (!cache || keys[i].empty()) continue;
    const TuneVerdict* had = cache->find(kCacheKey + keys[i]);
    const bool fused = out[i].fused;
    if (!timed[i] && had && (had->choice == "fused") == fused) continue;
    TuneVerdict v;
    v.choice = fused ? "fused" : "apart";
    v.ms = fused ? out[i].fused_ms : out[i].apart_ms;
    v.runner_up = fused ? "apart" : "fused";
    v.runner_up_ms = fused ? out[i].apart_ms : out[i].fused_ms;
    cache->put(kCacheKey + keys[i], v);
  }
  return out;
}

void set_fusion(Model& model, bool on) {
  for (FusionChain& c : fusion_chains(model.net())) c.set_fused(on);
}

std::string fusion_summary(const std::vector<FusionVerdict>& v) {
  int fused = 0, cached = 0, provisional = 0;
  double chosen = 0, apart = 0, all_fused = 0;
  for (const FusionVerdict& f : v) {
    fused += f.fused;
    cached += f.cached;
    provisional += f.provisional;
    chosen += f.fused ? f.fused_ms : f.apart_ms;
    apart += f.apart_ms;
    all_fused += f.fused_ms;
  }
  return str("--fusion auto: ", fused, " of ", v.size(),
             " conv + BN+ReLU + conv chains fused, where timing said they beat the layers apart (",
             "the chains' forward and backward: ", fmt_fixed(chosen, 2), " ms as chosen, ",
             fmt_fixed(apart, 2), " ms all apart, ", fmt_fixed(all_fused, 2), " ms all fused",
             cached ? str("; ", cached, " as the kernel cache had them, untimed") : std::string(),
             provisional ? str("; ", provisional, " timed on fused graphs planned past the "
                               "planning budget, untimed: not kept, a restart times them")
                         : std::string(),
             ")");
}

}  // namespace spotrain
