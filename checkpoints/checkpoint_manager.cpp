// CheckpointManager (see checkpoint_manager.h).
#include "checkpoints/checkpoint_manager.h"

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "core/atomic_file.h"
#include "core/clock.h"
#include "core/error.h"
#include "core/log.h"
#include "core/environment.h"

namespace spotrain {

CheckpointManager::CheckpointManager(const CheckpointPolicy& policy, int64_t bytes_each)
    : policy_(policy), bytes_each_(bytes_each), writer_(policy.keep), last_time_(now_seconds()) {
  SPOTRAIN_CHECK(!policy_.dir.empty(), "internal: a checkpoint manager without a folder");
  check_folder(bytes_each);
}

// Fail now, not after hours of training, when checkpoints cannot be written: the folder
// must be writable and hold a new checkpoint next to the previous one.
void CheckpointManager::check_folder(int64_t need) {
  namespace fs = std::filesystem;
  const std::string& dir = policy_.dir;
  std::error_code ec;
  fs::create_directories(dir, ec);
  std::string probe = dir + "/.write-test";
  {
    std::ofstream f(probe);
    SPOTRAIN_CHECK(!ec && f.good(), "checkpoint directory ", dir,
                   " is not writable; pass a writable --ckpt-dir");
  }
  fs::remove(probe, ec);
  // Half-written files of a process killed mid-write: never valid, safe to remove.
  for (auto& e : fs::directory_iterator(dir, ec)) {
    std::string n = e.path().filename().string();
    const bool tmp = e.path().extension() == ".tmp";
    if (tmp && n.rfind("latest.", 0) == 0) {  // a pointer's write that was cut short
      fs::remove(e.path(), ec);
    } else if (tmp && n.rfind("ckpt-", 0) == 0) {
      log_info(str("removing the unfinished checkpoint ", e.path().string(),
                   " (a write was interrupted)"));
      fs::remove(e.path(), ec);
    } else if (n.rfind(".survivor-", 0) == 0) {  // a survivor's claim (run/run_checkpoints.h)
      fs::remove(e.path(), ec);
    }
  }
  std::error_code space_ec;
  int64_t free_bytes = int64_t(fs::space(dir, space_ec).available);
  if (test_hooks().free_bytes >= 0) {
    free_bytes = test_hooks().free_bytes;
    space_ec.clear();
  }
  if (space_ec) return;  // space unknown (some network filesystems): the writes will tell
  auto mib = [](int64_t b) { return fmt_fixed(double(b) / double(1 << 20), 1) + " MiB"; };
  SPOTRAIN_CHECK(free_bytes >= 2 * need, "checkpoint directory ", dir, " has ", mib(free_bytes),
                 " free; writing a checkpoint of this model (", mib(need),
                 ") while keeping the previous one needs ", mib(2 * need),
                 "; free some space or pass another --ckpt-dir");
  int64_t keep_need = need * (policy_.keep > 0 ? policy_.keep + 1 : 4);
  if (free_bytes < keep_need)
    log_info(str("warning: checkpoint directory ", dir, " has ", mib(free_bytes), " free; --keep ",
                 policy_.keep, " needs about ", mib(keep_need)));
}

std::string CheckpointManager::path_for(int64_t step) const { return checkpoint_path(policy_.dir, step); }

bool CheckpointManager::due(int64_t step, bool epoch_end) const {
  return epoch_end || (policy_.every_steps > 0 && step % policy_.every_steps == 0) ||
         (policy_.every_minutes > 0 && now_seconds() - last_time_ >= policy_.every_minutes * 60);
}

std::string CheckpointManager::write(int64_t step, const SnapshotFn& snapshot, bool sync) {
  const std::string path = path_for(step);
  if (writer_.busy()) {
    double t0 = now_seconds();
    writer_.settle();
    if (!sync)
      log_info(str("warning: the previous checkpoint write was still running; training waited ",
                   fmt_fixed(now_seconds() - t0, 2), " s (checkpoints are due faster than the disk "
                   "writes them: raise --ckpt-every)"));
  }
  poll();
  double t0 = now_seconds();
  writer_.submit(path, snapshot(), policy_.writer_tag.empty() ? "" : str(path, ".", policy_.writer_tag, ".tmp"));
  writing_ = path;
  snapshot_seconds_ = now_seconds() - t0;
  last_time_ = now_seconds();
  if (sync) {
    try {
      writer_.wait();
    } catch (const std::exception& e) {
      writing_.clear();
      SPOTRAIN_THROW(failure(path, e));
    }
    ++writes_done_;
    log_info(str("checkpoint written: ", path, " in ",
                 fmt_fixed(snapshot_seconds_ + writer_.last_write_seconds(), 2), " s"));
    writing_.clear();
  } else {
    log_info(str("checkpoint ", path, ": training held ", fmt_fixed(snapshot_seconds_, 3),
                 " s for the state copy, writing in the background"));
  }
  return path;
}

void CheckpointManager::poll() {
  if (writing_.empty() || writer_.busy()) return;
  std::string path = writing_;
  writing_.clear();
  try {
    writer_.check();
  } catch (const std::exception& e) {
    if (!policy_.continue_on_error)
      SPOTRAIN_THROW(failure(path, e), "; make room and resume with --resume auto (or train on "
                     "through such failures with --on-ckpt-error continue)");
    log_info(str("warning: ", failure(path, e), "; training goes on (--on-ckpt-error continue) "
                 "and the next checkpoint tries again"));
    return;
  }
  ++writes_done_;
  log_info(str("checkpoint written: ", path, " in ", fmt_fixed(writer_.last_write_seconds(), 2),
               " s (background)"));
}

std::string checkpoint_failure_cause(const std::string& what, const std::string& dir,
                                     int64_t free_bytes, bool writable, int64_t bytes_each) {
  auto mib = [](int64_t b) { return fmt_fixed(double(b) / double(1 << 20), 1) + " MiB"; };
  // The system's own reason when the write carried one; else what the folder looks like now
  // (a failed write removes its partial file, so the free space seen here may have grown back).
  const bool no_space = what.find("No space left on device") != std::string::npos ||
                        what.find("Disk quota exceeded") != std::string::npos;
  const bool read_only = what.find("Read-only file system") != std::string::npos;
  if (read_only || (!no_space && !writable && free_bytes > bytes_each))
    return "the folder " + dir + " is no longer writable (read-only or gone)";
  if (no_space || free_bytes < bytes_each + (1 << 20)) {
    const bool room_now = free_bytes >= bytes_each;
    return std::string("the disk is full (") + (room_now ? "the write ran out of space; " : "") +
           mib(free_bytes) + " free in " + dir + (room_now ? " now" : "") +
           ", a checkpoint needs " + mib(bytes_each) + ")";
  }
  return what;
}

std::string CheckpointManager::failure(const std::string& path, const std::exception& e) const {
  namespace fs = std::filesystem;
  const std::string& dir = policy_.dir;
  std::error_code ec;
  int64_t free_bytes = int64_t(fs::space(dir, ec).available);
  if (test_hooks().free_bytes >= 0) free_bytes = test_hooks().free_bytes;
  const std::string probe = dir + "/.write-test";
  bool writable = bool(std::ofstream(probe));
  fs::remove(probe, ec);
  std::string why = checkpoint_failure_cause(e.what(), dir, free_bytes, writable, bytes_each_);
  std::string safe = "no earlier checkpoint of this run";
  std::ifstream latest(dir + "/latest");
  std::string name;
  if (latest >> name) safe = "the newest checkpoint, " + dir + "/" + name + ", and older ones are intact";
  return "checkpoint " + path + " could not be written: " + why + "; " + safe;
}

void CheckpointManager::write_class_names(const std::vector<std::string>& names) const {
  if (names.empty()) return;
  std::string text;
  for (auto& c : names) text += c + "\n";
  write_file_atomic(policy_.dir + "/classes.txt", text, "the class list");
}

}  // namespace spotrain
