// Background checkpoint writing: the training loop hands over a host snapshot at a step
// boundary and goes on; one thread writes, verifies and publishes it (`latest`, keep-N).
// At most one write is in flight; a failed write is reported at the next boundary.
#pragma once
#include <atomic>
#include <exception>
#include <string>
#include <thread>

#include "checkpoints/checkpoint.h"

namespace spotrain {

class AsyncCheckpointWriter {
 public:
  explicit AsyncCheckpointWriter(int keep) : keep_(keep) {}
  ~AsyncCheckpointWriter();  // waits for the write in flight (errors are then only printed)
  AsyncCheckpointWriter(const AsyncCheckpointWriter&) = delete;
  AsyncCheckpointWriter& operator=(const AsyncCheckpointWriter&) = delete;

  // True while a write is in flight.
  bool busy() const { return thread_.joinable() && !done_.load(); }
  // Starts writing `snap` to `path` (through the temporary `tmp`; "" = PATH.tmp); waits first
  // if a write is still in flight.
  void submit(std::string path, CheckpointSnapshot snap, std::string tmp = "");
  // Waits for the write in flight, if any; rethrows its error.
  void wait();
  // Waits for the write in flight, if any; its error is left for check().
  void settle() {
    if (thread_.joinable()) thread_.join();
  }
  // Rethrows the error of a write that has finished, without waiting for one in flight.
  void check();
  // Seconds the latest finished write took (write + verify + publish); 0 before the first.
  double last_write_seconds() const { return last_seconds_.load(); }

 private:
  void join_finished();
  int keep_;
  std::thread thread_;
  std::atomic<bool> done_{false};
  std::atomic<double> last_seconds_{0};
  std::exception_ptr error_;  // set by the writer thread before done_
};

}  // namespace spotrain
