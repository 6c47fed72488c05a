// Every environment variable that changes how spotrain behaves, in one place. Most are test
// hooks the fault-tolerance tests use to make a failure happen at a chosen moment; one is a
// diagnostic. Each is read once, at first use; none is meant for production runs.
//
//   SPOTRAIN_FAULT=KIND:RANK:STEP[,...] die (SIGKILL, as a lost node), hang (sleep forever) or
//                                      term (SIGTERM, as a spot notice) that rank at that step
//   SPOTRAIN_SAMPLE_LOG=FILE           append "step id id ..." per training step (FILE.RANK
//                                      with several ranks): which samples each step saw
//   SPOTRAIN_FREE_BYTES=N              pretend the checkpoint folder has N bytes free
//   SPOTRAIN_CKPT_WRITE_DELAY=S[:STEP] pause checkpoint writes (from global step STEP on) half
//                                      way, the .tmp file written, so a test can kill the run
//   SPOTRAIN_NO_FUSED_BN_ADD=1         GPU diagnostic: a residual block's last BN, Add and ReLU
//                                      as separate ops (to measure or rule out the fusion)
//   SPOTRAIN_WRONG_OP=OP[,OP...]       plant a wrong op: the backend doubles the output of each
//                                      op named (as the op profiler names it: conv2d_forward,
//                                      upload_pixels, bn_relu+conv2d_forward+stats, ...), so a
//                                      test sees `doctor` and the fast paths' first-use checks
//                                      catch a kernel that computes something else
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace spotrain {

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
  bool no_fused_bn_add = false;
  std::vector<std::string> wrong_ops;  // SPOTRAIN_WRONG_OP
};

// The hooks set in this process's environment (read once).
const TestHooks& test_hooks();

// The same, to change in a test of this process (the environment is read before the first use).
TestHooks& test_hooks_for_test();
// Whether SPOTRAIN_WRONG_OP names `op`.
bool wrong_op_planted(const char* op);

// SPOTRAIN_FAULT: does what it says when `rank` reaches `step` (1-based); else nothing.
void inject_fault(int rank, int64_t step);

}  // namespace spotrain
