// Interruptions at random points: a deterministic run is started again and again with
// --resume auto and each time SIGTERMed or SIGKILLed at a random moment (seeded, counted from
// when the rank can take a stop signal): during start-up and resume, mid-step, and, with
// checkpoint writes slowed half-way by a test hook, during background writes. After every
// interruption each checkpoint left verifies; at the end a last resume finishes and its weights
// equal an uninterrupted run's, bit for bit. On one rank, and on two under mpirun (the signal
// to one rank).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>

#include "ckpt_state.h"
#include "run_command.h"

namespace fs = std::filesystem;

namespace {

std::string train_cmd(int ranks, const fs::path& dir) {
  std::string cmd = std::string(SPOTRAIN_BIN) +
                    " train --model resnet20 --data synthetic --train-limit 4096 --test-limit 16"
                    " --batch-size 16 --threads 1 --steps 300 --ckpt-every 3 --keep 3 --log-every 1"
                    " --deterministic --resume auto --ckpt-dir " + dir.string();
  if (ranks == 1) return cmd;
  return "env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 " +
         std::string(MPIEXEC_EXECUTABLE) +
         " -np 2 --oversubscribe --bind-to none -x OMP_NUM_THREADS=1 -x SPOTRAIN_CKPT_WRITE_DELAY " + cmd;
}

void interrupt_at_random_points(int ranks) {
  const fs::path d = fs::temp_directory_path() / ("spotrain_interrupts_" + std::to_string(ranks));
  fs::remove_all(d);
  fs::create_directories(d);
  const fs::path run = d / "run";
  std::mt19937 rng(1234 + ranks);
  std::uniform_real_distribution<double> when(0.0, 1.5);
  int interrupted = 0;
  for (int i = 0; i < 12; ++i) {
    const bool kill = i % 2 == 1;
    const double at = when(rng);
    const int rank = int(rng() % unsigned(ranks));
    // The rank's process: the spotrain whose command line names this run folder; with two
    // ranks, the first or the second started.
    const std::string pick = "$(pgrep -f -- '^" + std::string(SPOTRAIN_BIN) + " train .*--ckpt-dir " +
                             run.string() + "$' | sort -n | sed -n '" +
                             std::to_string(rank + 1) + "p')";
    // The moment counts from when the rank catches SIGTERM (SigCgt, bit 14: its stop handler is
    // installed; before that a SIGTERM kills it, 143), not from the command's start: on a slow
    // machine, or under mpirun's slower start, a moment counted from there could come before the
    // rank exists (no signal sent, the run trains to its end) or can stop.
    const std::string ready = "while kill -0 $job 2>/dev/null; do p=" + pick + "; m=$([ -n \"$p\" ] && "
                              "sed -n 's/^SigCgt:[[:space:]]*//p' /proc/$p/status 2>/dev/null); "
                              "[ -n \"$m\" ] && [ $(( (0x$m >> 14) & 1 )) = 1 ] && break; p=; sleep 0.01; done\n";
    CommandResult r = run_command(
        "export SPOTRAIN_CKPT_WRITE_DELAY=0.2; (" + train_cmd(ranks, run) + ") > " + (d / "log").string() +
        " 2>&1 &\njob=$!\n" + ready + "sleep " + std::to_string(at) + "\n[ -n \"$p\" ] && kill -" +
        (kill ? "KILL" : "TERM") + " $p\nwait $job\necho \"exit $?\"");
    // Interrupted (not finished): a SIGTERM, whenever it comes, is a stop (75); a SIGKILL
    // kills, or aborts the job.
    interrupted += r.out.find("exit 0") == std::string::npos;
    if (!kill && r.out.find("exit 0") == std::string::npos) {
      EXPECT_NE(r.out.find("exit 75"), std::string::npos) << "SIGTERM at " << at << " s:\n" << r.out;
    }
    std::printf("interruption %d: %s at %.2f s of rank %d: %s", i, kill ? "SIGKILL" : "SIGTERM", at,
                rank, r.out.substr(r.out.rfind("exit ")).c_str());
    // Whatever the moment, every checkpoint file left is whole and verifies.
    for (auto& e : fs::directory_iterator(run)) {
      if (e.path().extension() != ".h5") continue;
      CommandResult v = run_command(std::string(SPOTRAIN_BIN) + " ckpt verify " + e.path().string());
      EXPECT_EQ(v.code, 0) << "after interruption " << i << " (" << (kill ? "SIGKILL" : "SIGTERM")
                           << " at " << at << " s): " << e.path() << "\n" << v.out << r.out;
    }
  }
  // Most moments fall before the run's end (a run that finished is not interrupted).
  EXPECT_GE(interrupted, 8);
  // The last resume finishes, on the weights of a run never interrupted.
  CommandResult fin = run_command("export SPOTRAIN_CKPT_WRITE_DELAY=0; " + train_cmd(ranks, run));
  ASSERT_EQ(fin.code, 0) << fin.out;
  CommandResult ref = run_command("export SPOTRAIN_CKPT_WRITE_DELAY=0; " + train_cmd(ranks, d / "ref"));
  ASSERT_EQ(ref.code, 0) << ref.out;
  expect_same_weights_and_momentum((d / "ref" / "ckpt-00000300.h5").string(),
                                   (run / "ckpt-00000300.h5").string());
  fs::remove_all(d);
}

TEST(InterruptPoints, OneRank) { interrupt_at_random_points(1); }
TEST(InterruptPoints, TwoRanks) { interrupt_at_random_points(2); }

}  // namespace
