// The run folder (--ckpt-dir) is the job: the resolved settings (config.toml: give it back
// with --config to restart), the run's fingerprint (run.json), the metrics (metrics.jsonl,
// appended across restarts), the log (train.log), classes.txt and the checkpoints. Rank 0
// holds an exclusive lock on it while it runs (flock: the kernel drops it when the holder
// dies) and refuses a second process, naming the holder. It never mixes two runs: a folder
// that holds another run's checkpoints is used only by the same run resuming (--resume), or
// with --new-run, which moves the old run's files into previous-<time>/ first. While it is
// held, the log also goes to the folder's train.log.
#pragma once
#include <cstdio>
#include <string>

#include "run/config.h"

namespace spotrain {

class RunFolder {
 public:
  // Creates and locks `cfg.ckpt_dir`, checks that this run may use it, writes the run's
  // fingerprint and settings and opens train.log; throws Error saying what to do when it may not.
  explicit RunFolder(const RunConfig& cfg);
  ~RunFolder();  // closes train.log, releases the lock
  RunFolder(const RunFolder&) = delete;
  RunFolder& operator=(const RunFolder&) = delete;

  const std::string& dir() const { return dir_; }
  std::string path(const std::string& name) const { return dir_ + "/" + name; }

 private:
  void lock();
  void claim(const RunConfig& cfg);
  void move_aside();
  void open_log();
  std::string dir_;
  int lock_fd_ = -1;
  FILE* log_ = nullptr;  // train.log
};

// What identifies a run: the settings a continuation must share (model, data, seed, ...),
// as JSON.
std::string run_fingerprint(const RunConfig& cfg);

// The plan of `--plan FILE` (`spotrain plan ... --json FILE`), checked: one with a chosen offer,
// as the run folder keeps it (plan.json). Every rank reads it at start, so a bad one stops the
// job before anything runs.
std::string read_plan(const std::string& file);

}  // namespace spotrain
