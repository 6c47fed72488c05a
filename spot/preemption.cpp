// Stop-flag signal handlers (see preemption.h).
#include "spot/preemption.h"

#include <atomic>
#include <csignal>
#include <initializer_list>
#include <mutex>
#include <string>

namespace spotrain {

namespace {
std::atomic<int> g_stop{0};  // lock-free: safe in a signal handler and across threads
static_assert(std::atomic<int>::is_always_lock_free, "the stop flag is set in a signal handler");
extern "C" void on_stop_signal(int) { g_stop = 1; }
}  // namespace

void install_stop_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  for (int sig : {SIGTERM, SIGINT, SIGUSR1}) sigaction(sig, &sa, nullptr);
}

bool stop_requested() { return g_stop != 0; }
void request_stop() { g_stop = 1; }

namespace {
std::mutex g_reason_mu;
std::string g_reason;  // set by request_stop(reason), before the flag
}  // namespace

void request_stop(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lk(g_reason_mu);
    if (g_reason.empty()) g_reason = reason;
  }
  g_stop = 1;
}

std::string stop_reason() {
  std::lock_guard<std::mutex> lk(g_reason_mu);
  return g_reason.empty() ? "a signal" : g_reason;
}

}  // namespace spotrain
