// AsyncCheckpointWriter (see async_writer.h).
#include "checkpoints/async_writer.h"

#include <cstdio>

#include "core/clock.h"
#include "core/error.h"

namespace spotrain {

AsyncCheckpointWriter::~AsyncCheckpointWriter() {
  try {
    wait();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: checkpoint write failed: %s\n", e.what());
  }
}

void AsyncCheckpointWriter::submit(std::string path, CheckpointSnapshot snap, std::string tmp) {
  wait();
  done_ = false;
  thread_ = std::thread([this, path = std::move(path), snap = std::move(snap), tmp = std::move(tmp)] {
    const double t0 = now_seconds();
    try {
      write_checkpoint_file(path, snap, tmp);
      finish_checkpoint(path, keep_);
    } catch (...) {
      error_ = std::current_exception();
    }
    last_seconds_ = now_seconds() - t0;
    done_ = true;
  });
}

void AsyncCheckpointWriter::join_finished() {
  if (thread_.joinable()) thread_.join();
  if (error_) {
    auto e = error_;
    error_ = nullptr;
    std::rethrow_exception(e);
  }
}

void AsyncCheckpointWriter::wait() { join_finished(); }

void AsyncCheckpointWriter::check() {
  if (thread_.joinable() && !done_.load()) return;  // still writing
  join_finished();
}

}  // namespace spotrain
