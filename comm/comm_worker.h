// CommWorker: one thread that makes every collective call, in submission order, so
// gradient buckets are all-reduced while backward goes on, and so every wait has a
// deadline. A collective that fails or outlives --comm-timeout is a lost peer: the rank runs
// its last words (on_lost_peer: the survivors save the last finished step), prints one error
// line naming this rank, the step and the collective, then aborts the whole job (never a
// silent hang), after leaving the launcher's runtime its time to notice a lost node and end
// the job itself.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>

#include "comm/communicator.h"

namespace spotrain {

class CommWorker {
 public:
  CommWorker(Communicator& comm, double timeout_s);
  ~CommWorker();
  CommWorker(const CommWorker&) = delete;
  CommWorker& operator=(const CommWorker&) = delete;

  // Queues `task` (a collective call described by `what`); returns a ticket for wait().
  uint64_t submit(std::string what, std::function<void()> task);
  // Blocks until the ticket's task finished; on error or timeout aborts the job.
  void wait(uint64_t ticket);
  void run(std::string what, std::function<void()> task) { wait(submit(std::move(what), std::move(task))); }
  void set_step(int64_t step) { step_ = step; }
  // What this rank does once it knows a peer is lost, before the job is aborted; run on the
  // thread whose wait found the loss, once. It must not make collective calls, nor print (a
  // line sent now can keep the runtime from noticing a lost node): it returns what to say.
  void on_lost_peer(std::function<std::string()> last_words) { last_words_ = std::move(last_words); }
  // Checked about ten times a second while a wait lasts, with when the wait began and when the
  // last collective finished (now_seconds()): when it answers true, the wait ends as a lost
  // peer before --comm-timeout (e.g. the launcher signalled the end of a job whose rank died,
  // and nothing has finished since).
  void watch_for_loss(std::function<bool(double wait_started, double last_finished)> lost) {
    lost_ = std::move(lost);
  }
  Communicator& comm() { return comm_; }
  double timeout_seconds() const { return timeout_s_; }

 private:
  struct Job {
    uint64_t id;
    std::string what;
    std::function<void()> task;
  };
  void loop();
  // runtime_ending: the launcher's runtime is ending the job already (no time left for it to
  // notice a lost node).
  [[noreturn]] void fail(const std::string& what, const std::string& why, bool runtime_ending = false);

  Communicator& comm_;
  double timeout_s_;
  std::function<std::string()> last_words_;
  std::function<bool(double, double)> lost_;
  double last_finished_ = 0;  // when a task last finished (now_seconds())
  int64_t step_ = 0;
  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  std::deque<Job> queue_;
  std::map<uint64_t, std::string> errors_;  // ticket -> error text
  std::string running_;                     // what the worker is doing now
  uint64_t next_id_ = 1, finished_upto_ = 0;
  bool stop_ = false;
  std::thread thread_;
};

// Sums n values over the worker's ranks (through fp32: counts are exact up to 2^24, and a sum
// of one rank's value and zeros is that value rounded once, the same on every rank), as one
// all-reduce; a no-op on one rank.
void sum_across_ranks(CommWorker& worker, double* values, int n, const std::string& what);

}  // namespace spotrain
