// Stop-flag signal handlers (see preemption.h).
#include "spot/preemption.h"

#include <atomic>
#include <csignal>
#include <cstdint>
#include <ctime>
#include <initializer_list>
#include <mutex>
#include <string>

namespace spotrain {

namespace {
std::atomic<int> g_stop{0};  // lock-free: safe in a signal handler and across threads
static_assert(std::atomic<int>::is_always_lock_free, "the stop flag is set in a signal handler");
// When the first stop came: CLOCK_MONOTONIC nanoseconds (steady_clock's, so now_seconds()'s).
std::atomic<int64_t> g_stop_ns{0};
static_assert(std::atomic<int64_t>::is_always_lock_free, "set in a signal handler");

std::atomic<int> g_signal{0};  // the first stop signal's number (0: none)

void mark_stop() {  // async-signal-safe
  if (g_stop_ns.load() == 0) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    int64_t expected = 0;
    g_stop_ns.compare_exchange_strong(expected, int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec);
  }
  g_stop = 1;
}

extern "C" void on_stop_signal(int sig) {  // async-signal-safe
  int none = 0;
  g_signal.compare_exchange_strong(none, sig);
  mark_stop();
}

std::atomic<int64_t> g_cont_ns{0};
extern "C" void on_continue_signal(int) {  // async-signal-safe
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  g_cont_ns = int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}
}  // namespace

void install_stop_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  for (int sig : {SIGTERM, SIGINT, SIGUSR1}) sigaction(sig, &sa, nullptr);
  struct sigaction cont {};
  cont.sa_handler = on_continue_signal;  // the process continues as by default
  sigemptyset(&cont.sa_mask);
  cont.sa_flags = SA_RESTART;
  sigaction(SIGCONT, &cont, nullptr);
}

double continue_signal_at() { return double(g_cont_ns.load()) * 1e-9; }

bool stop_requested() { return g_stop != 0; }
void request_stop() { mark_stop(); }

double stop_requested_at() { return double(g_stop_ns.load()) * 1e-9; }

namespace {
std::mutex g_reason_mu;
std::string g_reason;  // set by request_stop(reason), before the flag
}  // namespace

void request_stop(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lk(g_reason_mu);
    if (g_reason.empty()) g_reason = reason;
  }
  mark_stop();
}

std::string stop_reason() {
  std::lock_guard<std::mutex> lk(g_reason_mu);
  if (!g_reason.empty()) return g_reason;
  switch (g_signal.load()) {
    case SIGTERM: return "SIGTERM";
    case SIGINT: return "SIGINT";
    case SIGUSR1: return "SIGUSR1";
    default: return "a stop request";
  }
}

}  // namespace spotrain
