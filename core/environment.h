// The environment variables that change how spotrain behaves (SPOTRAIN_*), read once, at first
// use, into one struct: the launcher's words to the ranks (examples/resnet50/launch/mpirun.sh
// sets them), and the test hooks the fault-tolerance tests use to make a failure happen at a
// chosen moment, with a few diagnostics. No other file reads a SPOTRAIN_* variable.
//
// The launcher's words:
//   SPOTRAIN_STOP_EXIT_CODE=N          a finished stop exits N instead of 75 (core/exit_codes.h)
//   SPOTRAIN_HOSTS="A B ..."           the hosts of this start, as the launcher names them: each
//                                      rank names its own host so (comm/hosts.h)
//   SPOTRAIN_LEAVE_HOSTS=1             the launcher restarts a job without a host it stopped to
//                                      leave behind (--straggler-action leave, run/leave_rule.h)
//   SPOTRAIN_MIN_HOSTS=N               ... but not below N hosts (default 1)
//   SPOTRAIN_HOST_RATES="A=R B=R ..."  each host's training images/s as the health gate measured
//                                      it (mpirun.sh with HEALTH_CHECK=1): the first shares of the
//                                      global batch follow them (run/rebalance.h)
//
// The test hooks and diagnostics (none is meant for production runs):
//   SPOTRAIN_FAULT=KIND:RANK:STEP[,...] die (SIGKILL, as a lost node), hang (sleep forever) or
//                                      term (SIGTERM, as a spot notice) that rank at that step
//   SPOTRAIN_SAMPLE_LOG=FILE           append "step id id ..." per training step (FILE.RANK
//                                      with several ranks): which samples each step saw
//   SPOTRAIN_FREE_BYTES=N              pretend the checkpoint folder has N bytes free
//   SPOTRAIN_CKPT_WRITE_DELAY=S[:STEP] pause checkpoint writes (from global step STEP on) half
//                                      way, the .tmp file written, so a test can kill the run
//   SPOTRAIN_STEP_DELAY=S              sleep S seconds before each training step: a floor on the
//                                      step time, so what a test does on seeing a step line lands
//                                      before the run's end on a machine of any speed
//   SPOTRAIN_RUN_LOCK_DELAY=S          pause S seconds between taking the run folder's lock and
//                                      writing the holder's record in it, so a test can start a
//                                      second process then (it must still name the holder)
//   SPOTRAIN_NO_RANK_WATCH=1           diagnostic: no per-rank times or stragglers (to measure
//                                      what watching them costs: bench/straggler_overhead.sh)
//   SPOTRAIN_NO_FUSED_BN_ADD=1         GPU diagnostic: a residual block's last BN, Add and ReLU
//                                      as separate ops (to measure or rule out the fusion)
//   SPOTRAIN_KEEP_BN_RELU_OUTPUTS=1    CPU diagnostic: convolutions keep the batch norm + ReLU
//                                      output they read until their backward instead of making
//                                      it again there (to measure what remaking it saves and costs)
//   SPOTRAIN_CPU_LAYOUT=blocked|nhwc   CPU diagnostic: the activations' layout, in place of the
//                                      one preferred_cpu_activations picks (to compare them)
//   SPOTRAIN_WRONG_OP=OP[,OP...]       plant a wrong op: the tensor each op named returns (as
//                                      the op profiler names it: conv2d_forward, upload_pixels,
//                                      bn_relu+conv2d_forward+stats, ...) comes back doubled, so
//                                      a test sees `doctor` and the fast paths' first-use checks
//                                      catch a kernel that computes something else. A wrapper
//                                      around the backend does it (kernels/wrong_op_backend.h),
//                                      put there by the Session and the op suite only while the
//                                      hook names an op; ops returning no tensor are not planted
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace spotrain {

struct LauncherSettings {
  std::string stop_exit_code;      // "" = unset (parsed by stopped_exit_code())
  std::vector<std::string> hosts;  // SPOTRAIN_HOSTS, in order
  bool leave_hosts = false;
  int min_hosts = 1;
  std::map<std::string, double> host_rates;  // SPOTRAIN_HOST_RATES (positive rates only)
};

struct TestHooks {
  struct Fault {
    std::string kind;  // "die", "hang" or "term"
    int rank = -1;
    int64_t step = -1;
  };
  std::vector<Fault> faults;
  std::string sample_log;        // "" = none
  int64_t free_bytes = -1;       // -1 = ask the filesystem
  double ckpt_write_delay = 0;   // seconds (0 = none)
  int64_t ckpt_write_delay_from_step = 0;
  double step_delay = 0;         // seconds (0 = none)
  double run_lock_delay = 0;     // seconds (0 = none)
  bool no_fused_bn_add = false;
  bool no_rank_watch = false;
  bool keep_bn_relu_outputs = false;
  std::string cpu_layout;              // "" = the backend's choice
  std::vector<std::string> wrong_ops;  // SPOTRAIN_WRONG_OP
};

struct Environment {
  LauncherSettings launcher;
  TestHooks hooks;
};

// This process's SPOTRAIN_* variables (read once).
const Environment& environment();
inline const LauncherSettings& launcher_settings() { return environment().launcher; }
inline const TestHooks& test_hooks() { return environment().hooks; }

// The same, to change in a test of this process (the environment is read before the first use).
Environment& environment_for_test();
inline TestHooks& test_hooks_for_test() { return environment_for_test().hooks; }
// Whether SPOTRAIN_WRONG_OP names `op`.
bool wrong_op_planted(const char* op);

// SPOTRAIN_FAULT: does what it says when `rank` reaches `step` (1-based); else nothing. And
// SPOTRAIN_STEP_DELAY's sleep, at every step.
void inject_fault(int rank, int64_t step);

}  // namespace spotrain
