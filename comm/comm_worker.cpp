// CommWorker (see comm_worker.h).
#include "comm/comm_worker.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <utility>
#include <vector>

#include "core/clock.h"
#include "core/error.h"
#include "core/exit_codes.h"

namespace spotrain {

CommWorker::CommWorker(Communicator& comm, double timeout_s) : comm_(comm), timeout_s_(timeout_s) {
  SPOTRAIN_CHECK(timeout_s > 0, "--comm-timeout must be positive");
  thread_ = std::thread([this] { loop(); });
}

CommWorker::~CommWorker() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

uint64_t CommWorker::submit(std::string what, std::function<void()> task) {
  std::lock_guard<std::mutex> lk(mu_);
  uint64_t id = next_id_++;
  queue_.push_back(Job{id, std::move(what), std::move(task)});
  cv_.notify_all();
  return id;
}

void CommWorker::loop() {
  for (;;) {
    Job job;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop requested and nothing left
      job = std::move(queue_.front());
      queue_.pop_front();
      running_ = job.what;
    }
    std::string err;
    try {
      job.task();
    } catch (const std::exception& e) {
      err = e.what();
    }
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (!err.empty()) errors_[job.id] = job.what + ": " + err;
      finished_upto_ = job.id;
      last_finished_ = now_seconds();
    }
    done_cv_.notify_all();
  }
}

void CommWorker::wait(uint64_t ticket) {
  const double started = now_seconds();
  std::unique_lock<std::mutex> lk(mu_);
  using clock = std::chrono::steady_clock;
  const clock::time_point deadline =
      clock::now() + std::chrono::duration_cast<clock::duration>(std::chrono::duration<double>(timeout_s_));
  auto done = [&] { return finished_upto_ >= ticket; };
  while (!done()) {
    const clock::time_point slice = std::min(deadline, clock::now() + std::chrono::milliseconds(100));
    if (done_cv_.wait_until(lk, slice, done)) break;
    std::string what = running_;  // the collective that is stuck
    if (clock::now() >= deadline) {
      lk.unlock();
      fail(what, str("did not finish within --comm-timeout ", timeout_s_,
                     " s: another rank died or hung (see its log)"));
    }
    if (lost_) {
      const double last = last_finished_;
      lk.unlock();
      const bool lost = lost_(started, last);
      if (lost)
        fail(what, "did not finish long after the launcher began to end the job (a stop or its "
                   "SIGCONT): a rank was lost", /*runtime_ending=*/true);
      lk.lock();
    }
  }
  auto it = errors_.find(ticket);
  if (it != errors_.end()) {
    std::string why = it->second;
    lk.unlock();
    fail(why.substr(0, why.find(": ")), "failed: " + why.substr(why.find(": ") + 2));
  }
}

void CommWorker::fail(const std::string& what, const std::string& why, bool runtime_ending) {
  // The last words first (the survivors' save: local work), in silence like the wait below.
  std::string said;
  if (auto words = std::exchange(last_words_, nullptr)) {  // once, and never from within itself
    try {
      said = words();
    } catch (const std::exception& e) {
      said = str("after losing a peer: ", e.what());
    }
  }
  // A node that stopped answering is the runtime's to report: its end of the job reaches every
  // node, where ours would hang on the lost one. So it gets its detection time first, in
  // silence: a line written now travels over the runtime's connection to mpirun, and a TCP
  // connection with data in flight no longer notices that its peer is gone. A hung rank on a
  // live node the runtime leaves to us.
  double grace = runtime_ending ? 0 : comm_.runtime_detection_seconds();
  if (grace > 0) std::this_thread::sleep_for(std::chrono::duration<double>(grace));
  std::fprintf(stderr, "error: rank %d: %s at step %lld %s; aborting the job\n", comm_.rank(),
               what.c_str(), static_cast<long long>(step_), why.c_str());
  if (!said.empty()) std::fprintf(stderr, "rank %d: %s\n", comm_.rank(), said.c_str());
  std::fflush(stderr);
  comm_.abort(kExitRetryable);  // a peer or the network failed: retrying is the remedy
  std::abort();                  // not reached: abort() ends the job
}

void sum_across_ranks(CommWorker& worker, double* values, int n, const std::string& what) {
  if (worker.comm().size() == 1) return;
  std::vector<float> f(values, values + n);
  worker.run("all-reduce of " + what, [&] { worker.comm().allreduce_sum(f.data(), n, DType::f32); });
  for (int i = 0; i < n; ++i) values[i] = double(f[size_t(i)]);
}

}  // namespace spotrain
