// The SPOTRAIN_* variables, read once (see environment.h).
#include "core/environment.h"

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <thread>

namespace spotrain {

namespace {

LauncherSettings read_launcher() {
  LauncherSettings l;
  if (const char* v = std::getenv("SPOTRAIN_STOP_EXIT_CODE")) l.stop_exit_code = v;
  if (const char* v = std::getenv("SPOTRAIN_HOSTS")) {
    std::istringstream in(v);
    for (std::string h; in >> h;) l.hosts.push_back(h);
  }
  if (const char* v = std::getenv("SPOTRAIN_LEAVE_HOSTS")) l.leave_hosts = std::string(v) == "1";
  if (const char* v = std::getenv("SPOTRAIN_MIN_HOSTS")) l.min_hosts = std::max(1, std::atoi(v));
  if (const char* v = std::getenv("SPOTRAIN_HOST_RATES")) {
    std::istringstream in(v);
    for (std::string one; in >> one;) {
      const size_t eq = one.rfind('=');
      const double rate = eq == std::string::npos ? 0 : std::atof(one.c_str() + eq + 1);
      if (eq > 0 && rate > 0) l.host_rates[one.substr(0, eq)] = rate;
    }
  }
  return l;
}

TestHooks read_hooks() {
  TestHooks h;
  if (const char* v = std::getenv("SPOTRAIN_FAULT")) {
    std::stringstream list(v);
    for (std::string one; std::getline(list, one, ',');) {
      char kind[8] = {0};
      int r = -1;
      long long s = -1;
      if (std::sscanf(one.c_str(), "%7[a-z]:%d:%lld", kind, &r, &s) == 3)
        h.faults.push_back({kind, r, s});
      else
        std::fprintf(stderr, "warning: ignoring SPOTRAIN_FAULT '%s' (expected KIND:RANK:STEP)\n", one.c_str());
    }
  }
  if (const char* v = std::getenv("SPOTRAIN_SAMPLE_LOG")) h.sample_log = v;
  if (const char* v = std::getenv("SPOTRAIN_FREE_BYTES")) h.free_bytes = std::atoll(v);
  if (const char* v = std::getenv("SPOTRAIN_CKPT_WRITE_DELAY")) {
    double seconds = 0;
    long long from = 0;
    if (std::sscanf(v, "%lf:%lld", &seconds, &from) >= 1) {
      h.ckpt_write_delay = seconds;
      h.ckpt_write_delay_from_step = from;
    }
  }
  if (const char* v = std::getenv("SPOTRAIN_STEP_DELAY")) h.step_delay = std::atof(v);
  if (const char* v = std::getenv("SPOTRAIN_RUN_LOCK_DELAY")) h.run_lock_delay = std::atof(v);
  if (const char* v = std::getenv("SPOTRAIN_NO_RANK_WATCH")) h.no_rank_watch = std::string(v) == "1";
  if (const char* v = std::getenv("SPOTRAIN_NO_FUSED_BN_ADD"))
    h.no_fused_bn_add = *v && std::string(v) != "0";
  if (const char* v = std::getenv("SPOTRAIN_KEEP_BN_RELU_OUTPUTS"))
    h.keep_bn_relu_outputs = std::string(v) == "1";
  if (const char* v = std::getenv("SPOTRAIN_CPU_LAYOUT")) h.cpu_layout = v;
  if (const char* v = std::getenv("SPOTRAIN_WRONG_OP")) {
    std::stringstream list(v);
    for (std::string one; std::getline(list, one, ',');)
      if (!one.empty()) h.wrong_ops.push_back(one);
  }
  return h;
}

}  // namespace

Environment& environment_for_test() {
  static Environment env{read_launcher(), read_hooks()};
  return env;
}

const Environment& environment() { return environment_for_test(); }

bool wrong_op_planted(const char* op) {
  const std::vector<std::string>& w = test_hooks().wrong_ops;
  if (w.empty()) return false;
  for (const std::string& o : w)
    if (o == op) return true;
  return false;
}

void inject_fault(int rank, int64_t step) {
  if (test_hooks().step_delay > 0)
    std::this_thread::sleep_for(std::chrono::duration<double>(test_hooks().step_delay));
  for (const TestHooks::Fault& f : test_hooks().faults) {
    if (f.rank != rank || f.step != step) continue;
    std::fprintf(stderr, "rank %d: SPOTRAIN_FAULT %s at step %lld\n", rank, f.kind.c_str(),
                 static_cast<long long>(step));
    std::fflush(stderr);
    if (f.kind == "die") raise(SIGKILL);
    if (f.kind == "term") raise(SIGTERM);  // as a spot preemption notice
    if (f.kind == "hang")
      for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
  }
}

}  // namespace spotrain
