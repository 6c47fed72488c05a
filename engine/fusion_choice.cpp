// choose_fusion and its helpers (see fusion_choice.h).
#include "engine/fusion_choice.h"

#include <algorithm>
#include <functional>
#include <limits>
#include <map>

#include "core/clock.h"
#include "core/log.h"
#include "kernels/op_profiler.h"
#include "layers/fusion_chain.h"

namespace spotrain {

namespace {

// Milliseconds `run` takes on the device: between two marks of the device clock, or on the
// host around ops that compute as they are called (the CPU).
double time_ms(Backend& be, const std::function<void()>& run) {
  DeviceClock* clock = be.device_clock();
  if (!clock) {
    const double t0 = now_seconds();
    run();
    be.synchronize();
    return 1e3 * (now_seconds() - t0);
  }
  clock->record_mark();
  run();
  clock->record_mark();
  return clock->read_marks_ms().back();
}

// Both ways, each once to warm up (the first run of a shape chooses its kernels), then three
// times alternating; the best run of each.
FusionVerdict time_chain(Backend& be, const FusionChain& chain, const Tensor& x) {
  FusionChain::Scratch s = chain.make_scratch(be);
  chain.run(be, x, false, s);
  chain.run(be, x, true, s);
  FusionVerdict v;
  v.apart_ms = v.fused_ms = std::numeric_limits<double>::infinity();
  for (int round = 0; round < 3; ++round) {
    v.apart_ms = std::min(v.apart_ms, time_ms(be, [&] { chain.run(be, x, false, s); }));
    v.fused_ms = std::min(v.fused_ms, time_ms(be, [&] { chain.run(be, x, true, s); }));
  }
  v.fused = v.fused_ms <= kFusionWinsBelow * v.apart_ms;
  return v;
}

}  // namespace

std::vector<FusionVerdict> choose_fusion(Model& model, const Tensor& x) {
  Backend& be = model.backend();
  std::vector<FusionChain> chains = fusion_chains(model.net());
  std::vector<FusionVerdict> out;
  if (chains.empty()) return out;
  std::map<const Layer*, size_t> head;  // a chain's first convolution -> the chain
  for (size_t i = 0; i < chains.size(); ++i) head[&chains[i].head()] = i;
  // The device clock's marks are the op profiler's too: its pending ones are read into
  // durations first, and it is detached while the chains are timed.
  OpProfiler* prof = be.profiler();
  if (prof) {
    prof->resolve_pending();
    be.set_profiler(nullptr);
  }
  std::map<std::string, FusionVerdict> by_shape;  // chains of one shape are timed once
  try {
    model.forward_probed(x, [&](Layer& l, const Tensor& in) {
      auto it = head.find(&l);
      if (it == head.end()) return;
      const FusionChain& c = chains[it->second];
      const std::string key = c.shape_key(in);
      auto known = by_shape.find(key);
      if (known == by_shape.end()) known = by_shape.emplace(key, time_chain(be, c, in)).first;
      FusionVerdict v = known->second;
      v.chain = c.name();
      out.push_back(v);
      chains[it->second].set_fused(v.fused);
    });
  } catch (const Error& e) {
    // Training does not depend on the choice: it goes on with every chain apart.
    be.set_profiler(prof);
    set_fusion(model, false);
    log_info(str("warning: --fusion auto: timing the chains failed (", e.what(),
                 "); every chain runs apart"));
    return {};
  }
  be.set_profiler(prof);
  return out;
}

void set_fusion(Model& model, bool on) {
  for (FusionChain& c : fusion_chains(model.net())) c.set_fused(on);
}

std::string fusion_summary(const std::vector<FusionVerdict>& v) {
  int fused = 0;
  double chosen = 0, apart = 0, all_fused = 0;
  for (const FusionVerdict& f : v) {
    fused += f.fused;
    chosen += f.fused ? f.fused_ms : f.apart_ms;
    apart += f.apart_ms;
    all_fused += f.fused_ms;
  }
  return str("--fusion auto: ", fused, " of ", v.size(),
             " conv + BN+ReLU + conv chains fused, where timing said they beat the layers apart (",
             "the chains' forward and backward: ", fmt_fixed(chosen, 2), " ms as chosen, ",
             fmt_fixed(apart, 2), " ms all apart, ", fmt_fixed(all_fused, 2), " ms all fused)");
}

}  // namespace spotrain
