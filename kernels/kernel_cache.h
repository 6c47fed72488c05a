// Kernel choices made by timing (the fastest cuDNN algorithm or engine per op and shape, and
// whether a fused graph beats the separate ops), remembered in a JSON file keyed by the device
// (GPU, driver, library versions) and the shape, so that a job restarted after a reclaim runs
// its chosen kernels from the first step instead of timing them again. Device-neutral: the GPU
// backend fills it; the CPU has nothing to time. A cache is an optimisation: a file that cannot
// be read or written costs a warning, never the run.
#pragma once
#include <cstddef>
#include <map>
#include <string>

namespace spotrain {

// What timing chose for one op and shape, and what came next.
struct TuneVerdict {
  std::string choice;     // what to run, in the backend's words ("algo 1 math 1", "engine 7")
  double ms = 0;          // its measured time
  std::string runner_up;  // the next fastest ("" when it had no rival)
  double runner_up_ms = 0;
  // "0.412 ms, runner-up algo 1 math 1 0.430 ms", for --profile.
  std::string times() const;
};

class KernelCache {
 public:
  // `path`: the file ("" keeps the verdicts in memory only). `device`: the GPU, its driver and
  // library versions; verdicts recorded under another device string are kept in the file but
  // never used. Reads the file if it exists.
  KernelCache(std::string path, std::string device);

  // The verdict for `key` (an op and its shape) on this device, or nullptr.
  const TuneVerdict* find(const std::string& key) const;
  // Records a verdict (replacing any for `key`); save() writes it.
  void put(const std::string& key, TuneVerdict v);

  // Writes the verdicts recorded since the last save, merged into what the file holds now
  // (another rank on the node may have written since it was read), replacing the file whole.
  // Nothing to write: nothing done. A failure is a warning, once; returns whether written.
  bool save();

  const std::string& path() const { return path_; }
  const std::string& device() const { return device_; }
  // Verdicts for this device read from the file at construction.
  size_t loaded() const { return loaded_; }
  // Verdicts put() since the last save().
  size_t unsaved() const { return pending_.size(); }
  // What the file said when it could not be used ("" when it was read or absent).
  const std::string& load_problem() const { return load_problem_; }

  // The file a run uses for `setting` (--kernel-cache): "none" -> "", "auto" -> the run
  // folder's kernel-cache.json where there is a run folder, else
  // $XDG_CACHE_HOME/spotrain/kernel-cache.json (~/.cache when unset; "" without a home);
  // anything else is the file itself.
  static std::string resolve_path(const std::string& setting, const std::string& run_folder);

 private:
  std::string path_, device_;
  std::map<std::string, TuneVerdict> mine_;     // this device's verdicts, loaded and new
  std::map<std::string, TuneVerdict> pending_;  // put() since the last save
  size_t loaded_ = 0;
  std::string load_problem_;
  bool warned_ = false;
};

}  // namespace spotrain
