// `spotrain batch`: how a global batch splits over rank counts (run/global_batch.h), the answer
// a resume on that many ranks gives: each rank's micro-batch and micro-batches per step, or why
// there is none. mpirun.sh asks it for the rank counts a job may shrink or grow to.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "run/global_batch.h"
#include "tools/spotrain/commands.h"

namespace spotrain::cli {

namespace {

struct BatchOptions {
  int64_t global = 0, batch_size = 128;
  std::string ranks = "1-64";
  bool refused_only = false;
};

// "1-4,8,16" -> 1 2 3 4 8 16; throws Error for anything else.
std::vector<int> parse_ranks(const std::string& text) {
  std::vector<int> out;
  size_t at = 0;
  while (at <= text.size()) {
    const size_t comma = text.find(',', at);
    const std::string part = text.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    int lo = 0, hi = 0;
    char tail = 0;
    const int n = std::sscanf(part.c_str(), "%d-%d%c", &lo, &hi, &tail);
    if (n == 1) hi = lo;
    SPOTRAIN_CHECK((n == 1 || n == 2) && lo >= 1 && hi >= lo && hi <= (1 << 20), "--ranks '", text,
                   "': expected counts and ranges such as 1-8,16,32");
    for (int w = lo; w <= hi; ++w) out.push_back(w);
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  return out;
}

int run_batch(const BatchOptions& o) {
  SPOTRAIN_CHECK(o.global > 0, "--global-batch must be positive, got ", o.global);
  SPOTRAIN_CHECK(o.batch_size > 0, "--batch-size must be positive, got ", o.batch_size);
  std::string refused;
  for (int w : parse_ranks(o.ranks)) {
    BatchSplit s;
    std::string why;
    const bool ok = split_evenly(o.global, w, o.batch_size, &s, &why);
    if (!ok) refused += (refused.empty() ? "" : " ") + std::to_string(w);
    if (o.refused_only) continue;
    std::printf("%d rank(s): %s\n", w, ok ? s.text().c_str() : ("no split: " + why).c_str());
  }
  if (o.refused_only) std::printf("%s\n", refused.c_str());
  return 0;
}

}  // namespace

Command add_batch(CLI::App& app) {
  auto o = std::make_shared<BatchOptions>();
  auto* cmd = app.add_subcommand(
      "batch", "how a global batch splits over rank counts, as a resume on them splits it: each rank's "
               "micro-batch and micro-batches per step, or why none");
  cmd->add_option("--global-batch", o->global, "images per optimizer step over all ranks")->required();
  cmd->add_option("--batch-size", o->batch_size, "the most images a rank takes in one micro-batch (its memory)")
      ->capture_default_str();
  cmd->add_option("--ranks", o->ranks, "rank counts, e.g. 1-8,16,32")->capture_default_str();
  cmd->add_flag("--refused", o->refused_only, "print only the rank counts with no split, on one line");
  return {cmd, [o] { return run_batch(*o); }};
}

}  // namespace spotrain::cli
