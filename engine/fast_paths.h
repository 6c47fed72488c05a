// The first-use checks of the fast paths (--fusion auto's fused chains, captured steps, the
// 8-bit upload): each compares itself with its reference the first time it runs on a node, and
// where they differ beyond the op suite's bounds (kernels/op_tolerances.h) it is turned off for
// the run with one warning naming it and the difference. Failed verdicts are kept in the run
// folder (fast-paths.json, keyed by the device itself: host and GPU UUID, not the GPU model) so
// that a restart on the same device does not try the path again; any other device checks afresh.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "kernels/op_tolerances.h"

namespace spotrain {

// The paths checked, as fast-paths.json and the warnings name them.
inline constexpr const char* kFastPathFusion = "fusion";           // --fusion auto's chains
inline constexpr const char* kFastPathCapture = "captured-steps";  // --cuda-graph
inline constexpr const char* kFastPathPixels = "8-bit-upload";     // Backend::upload_pixels

// The normalized difference (||got - want|| / ||want||) a check allows between a fast path's
// result and its reference path's, both on this backend, for a result of op kind `kind` at
// `precision`: the op suite holds each of the two within op_tolerance(kind, precision) of the
// float64 reference, so they may differ by the sum, twice that.
double fast_path_tolerance(OpKind kind, OpPrecision precision);

// ||got - want|| / ||want||, infinite where got has a NaN or inf that want has not, or the
// sizes differ; 0 when both are all zeros. On host fp32 tensors or plain vectors.
double normalized_difference(const std::vector<float>& got, const std::vector<float>& want);
double normalized_difference(const Tensor& host_got, const Tensor& host_want);

// How far a step's weights `got` are from the reference step's `want` beyond one ulp of each
// weight, relative to the reference's update: ||max(0, |got - want| - ulp(want))|| /
// ||want - before||, infinite where got has an inf or NaN that want has not, or the sizes
// differ. Where a small rate (a warm-up's) makes an update a few ulps of its weight, gradients
// that differ by rounding (cuDNN's run to run) put the weight on either float beside the
// reference's, a difference of the order of the update itself: that ulp is allowed, anything
// beyond it (a wrong rate or scale, a wrong gradient) counts in full.
double update_difference(const std::vector<float>& before, const std::vector<float>& want,
                         const std::vector<float>& got);

// The device a verdict holds for, as fast-paths.json keys it: the host, the GPU's UUID and PCI
// slot, and `info` (model, driver, libraries: gpu_info_line); off a GPU (empty uuid) the host
// and `info` (the backend's name). A fault of one device turns its paths off on it alone, not
// on every device of its model, and a replacement GPU (a new UUID) checks afresh.
std::string fast_path_device(const std::string& host, const std::string& gpu_uuid,
                             const std::string& pci_bus_id, const std::string& info);

class FastPathChecks {
 public:
  // `path`: the run folder's fast-paths.json ("" keeps the verdicts in memory only);
  // `device`: fast_path_device() (verdicts of another device are ignored, and kept).
  // An unreadable file is a warning, never the run's end.
  FastPathChecks(std::string path, std::string device);

  // Whether `fast_path` is off: a check failed on this device, in this run or one before.
  bool off(const std::string& fast_path) const;
  // Why it is off ("" when it is not).
  std::string why_off(const std::string& fast_path) const;
  // Whether it was checked in this process (passed or failed).
  bool checked(const std::string& fast_path) const { return checked_.count(fast_path) > 0; }
  // What its check in this process found: "passed: <figure>" or "failed: <difference>"; ""
  // when it was not checked.
  std::string verdict(const std::string& fast_path) const {
    auto it = checked_.find(fast_path);
    return it == checked_.end() ? std::string() : it->second;
  }

  // A check passed: `figure` ("normalized difference 3.1e-06 within 5e-03"), logged by none.
  void passed(const std::string& fast_path, const std::string& figure);
  // A check failed: the path goes off, one warning line names it and `difference`, and the
  // verdict is written to the file (a failed write is a warning): merged, under a lock
  // (core/atomic_file.h, FileLock), into what the file holds when it is written, so that every
  // rank writes only its own device's verdicts and keeps every other rank's.
  void failed(const std::string& fast_path, const std::string& difference);

  const std::string& path() const { return path_; }

 private:
  void save();

  std::string path_, device_;
  std::map<std::string, std::string> off_;      // path -> the difference found (this device)
  std::map<std::string, std::string> checked_;  // path -> "passed: ..." / "failed: ..."
};

}  // namespace spotrain
