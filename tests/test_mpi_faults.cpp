// Multi-process behaviour of `spotrain train` under mpirun: a rank that dies or hangs ends
// the whole job with a non-zero exit in bounded time (never a silent hang), ranks started
// with different settings refuse to train, and a healthy 2-rank run finishes.
// Faults come from the SPOTRAIN_FAULT=die|hang:RANK:STEP test hook in run/trainer.cpp.
// Every launch runs under `timeout`, so a regression shows as a failure, not a stuck CTest.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ckpt_state.h"
#include "scratch_dir.h"
#include "text_search.h"

namespace {

struct Launch {
  int code = -1;
  std::string out;
  double seconds = 0;
};

// Safety net: no launch here may take longer than this.
constexpr int kSafetyNetSeconds = 90;

Launch run(const std::string& cmd) {
  // mpirun refuses to run as root without these (containers, CI); harmless otherwise.
  setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 0);
  setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 0);
  std::string full = "timeout -k 10 " + std::to_string(kSafetyNetSeconds) + " " + cmd + " 2>&1";
  Launch r;
  auto t0 = std::chrono::steady_clock::now();
  FILE* p = popen(full.c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  int st = pclose(p);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  return r;
}

std::string mpirun(int np, const std::string& extra_env = "") {
  std::string s = std::string(MPIEXEC_EXECUTABLE) + " -np " + std::to_string(np) +
                  " --oversubscribe --bind-to none -x OMP_NUM_THREADS=1";
  if (!extra_env.empty()) s += " -x " + extra_env;
  return s;
}

// A tiny training run: resnet20 on synthetic data, 8 steps, one compute thread.
std::string train_args(const std::string& more = "") {
  return std::string(SPOTRAIN_BIN) +
         " train --model resnet20 --data synthetic --train-limit 256 --test-limit 64 --steps 8"
         " --threads 1 --ckpt-dir '' --log-every 1 " +
         more;
}

TEST(MpiFaults, HealthyTwoRankRunFinishes) {
  Launch r = run(mpirun(2) + " " + train_args("--batch-size 16 --bucket-mb 0.25"));
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(count(r.out, "data parallel over 2 ranks"), 1) << "only rank 0 logs:\n" << r.out;
  EXPECT_TRUE(contains(r.out, "global batch 32")) << r.out;
  // 1.04 MiB of resnet20 gradients in buckets of 0.25 MB (the first one no larger).
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.out, m, std::regex("(\\d+) gradient buckets of up to 0.25 MB")))
      << r.out;
  EXPECT_GE(std::stoi(m[1]), 4) << r.out;
  EXPECT_TRUE(contains(r.out, "step 8/8")) << r.out;
  EXPECT_TRUE(contains(r.out, "(64 images)")) << "split evaluation covers the test set:\n" << r.out;
  EXPECT_FALSE(contains(r.out, "error:")) << r.out;
  RecordProperty("seconds", std::to_string(r.seconds));
}

TEST(MpiFaults, HealthyTwoRankRunWithCompressionFinishes) {
  Launch r = run(mpirun(2) + " " + train_args("--batch-size 16 --grad-compression fp16"));
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "compression fp16")) << r.out;
  EXPECT_TRUE(contains(r.out, "step 8/8")) << r.out;
}

// A rank killed at step 3 (as a preempted node): the job ends, non-zero, well before the
// communication timeout would have fired and far before the safety net.
TEST(MpiFaults, DeadRankEndsTheJob) {
  Launch r = run(mpirun(2, "SPOTRAIN_FAULT=die:1:3") + " " +
                 train_args("--batch-size 16 --comm-timeout 20"));
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "rank 1: SPOTRAIN_FAULT die at step 3")) << r.out;
  EXPECT_FALSE(contains(r.out, "step 8/8")) << r.out;
  EXPECT_LT(r.seconds, 40.0) << "the job outlived its dead rank:\n" << r.out;
  RecordProperty("seconds", std::to_string(r.seconds));
}

// A rank that hangs at step 3: the others' gradient all-reduce outlives --comm-timeout, and
// the job is aborted with an error naming the collective and the step.
TEST(MpiFaults, HungRankTimesOutWithClearError) {
  Launch r = run(mpirun(2, "SPOTRAIN_FAULT=hang:1:3") + " " +
                 train_args("--batch-size 16 --comm-timeout 5"));
  EXPECT_EQ(r.code, 76) << "a lost peer is the retryable exit code:\n" << r.out;
  EXPECT_TRUE(contains(r.out, "rank 1: SPOTRAIN_FAULT hang at step 3")) << r.out;
  EXPECT_TRUE(contains(r.out, "did not finish within --comm-timeout")) << r.out;
  EXPECT_TRUE(contains(r.out, "error: rank 0: all-reduce of gradient bucket")) << r.out;
  EXPECT_TRUE(contains(r.out, "at step 3 ")) << r.out;
  EXPECT_GT(r.seconds, 5.0) << "aborted before --comm-timeout passed:\n" << r.out;
  EXPECT_LT(r.seconds, 30.0) << r.out;
  RecordProperty("seconds", std::to_string(r.seconds));
}

// MPMD launch with a per-rank --batch-size: the start-up check refuses to train.
TEST(MpiFaults, MismatchedSettingsAreRefused) {
  std::string cmd = mpirun(1) + " " + train_args("--batch-size 16") + " : -np 1 " +
                    train_args("--batch-size 32");
  Launch r = run(cmd);
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "error: rank 1 was started with a different --batch-size")) << r.out;
  EXPECT_FALSE(contains(r.out, "step 1/")) << "training started anyway:\n" << r.out;
  EXPECT_LT(r.seconds, 40.0) << r.out;
}

TEST(MpiFaults, MismatchedCompressionIsRefused) {
  std::string cmd = mpirun(1) + " " + train_args("--batch-size 16") + " : -np 1 " +
                    train_args("--batch-size 16 --grad-compression bf16");
  Launch r = run(cmd);
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "error: rank 1 was started with a different --grad-compression"))
      << r.out;
}

// Preemption on 2 ranks: only rank 1 gets SIGTERM, at step 5. The flag travels with the
// gradient all-reduce, so both ranks stop after the same step, rank 0 saves, both exit 75;
// the resumed job then ends bitwise identical to a job that was never interrupted.
namespace fs = std::filesystem;

// An empty folder of this name under the temporary directory, for one test's files.
std::string resume_args(const fs::path& dir, const std::string& more = "") {
  return std::string(SPOTRAIN_BIN) +
         " train --model resnet20 --data synthetic --train-limit 256 --test-limit 64 --epochs 2"
         " --threads 1 --deterministic --log-every 1 --keep 100 --ckpt-dir " + dir.string() + " " + more;
}

std::vector<std::string> rank_files(const fs::path& prefix, int world) {
  std::vector<std::string> v;
  for (int r = 0; r < world; ++r) v.push_back(prefix.string() + "." + std::to_string(r));
  return v;
}

// step -> the ids each time it was trained (read_sample_log).
using SampleLog = std::map<int64_t, std::vector<std::vector<int64_t>>>;

// The start of the elastic tests: on `ranks` ranks with `batch` (such as "--batch-size 16"), the
// job straight through (d/a, its samples logged to d/a.ids.<rank>, read into `ids_a`) and the
// job stopped by SIGTERM after step 4 (d/s, exit 75).
void run_straight_and_stopped_after_4(const fs::path& d, int ranks, const std::string& batch, SampleLog& ids_a) {
  Launch a = run(mpirun(ranks, "SPOTRAIN_SAMPLE_LOG=" + (d / "a.ids").string()) + " " + resume_args(d / "a", batch));
  ASSERT_EQ(a.code, 0) << a.out;
  Launch s = run(mpirun(ranks, "SPOTRAIN_FAULT=term:0:4") + " " + resume_args(d / "s", batch));
  ASSERT_EQ(s.code, 75) << s.out;
  ids_a = read_sample_log(rank_files(d / "a.ids", ranks));
}

// A job resumed from the stop after step 4 trained steps 5..16 once each, each on the 32
// samples the straight job trained at that step (`ids_a`).
void expect_steps_5_to_16_as_straight(const SampleLog& ids, const SampleLog& ids_a) {
  ASSERT_EQ(ids.size(), 12u) << "steps 5..16 after the stop after step 4";
  for (auto& [step, runs] : ids) {
    ASSERT_EQ(runs.size(), 1u);
    ASSERT_EQ(runs[0].size(), 32u);
    EXPECT_EQ(runs[0], ids_a.at(step)[0]) << "step " << step;
  }
}

TEST(MpiResume, SignalOnOneRankStopsAllAndResumesBitwise) {
  fs::path d = fresh_dir("spotrain_mpi_resume");
  // 256 samples, global batch 32: 8 steps per epoch, 16 in all.
  std::string log_a = "SPOTRAIN_SAMPLE_LOG=" + (d / "a.ids").string();
  std::string log_b = "SPOTRAIN_SAMPLE_LOG=" + (d / "b.ids").string();
  Launch a = run(mpirun(2, log_a) + " " + resume_args(d / "a", "--batch-size 16"));
  ASSERT_EQ(a.code, 0) << a.out;
  Launch b1 = run(mpirun(2, log_b + " -x SPOTRAIN_FAULT=term:1:5") + " " +
                  resume_args(d / "b", "--batch-size 16"));
  EXPECT_EQ(b1.code, 75) << b1.out;
  EXPECT_TRUE(contains(b1.out, "stopped by a stop request on another rank after step 5"))
      << "rank 1's flag (raised as step 5 began) reaches rank 0 with step 5's all-reduce:\n"
      << b1.out;
  ASSERT_TRUE(fs::exists(d / "b" / "ckpt-00000005.h5")) << b1.out;
  Launch b2 = run(mpirun(2, log_b) + " " + resume_args(d / "b", "--batch-size 16 --resume auto"));
  ASSERT_EQ(b2.code, 0) << b2.out;
  EXPECT_TRUE(contains(b2.out, "step 5, 0 epochs and 5 batches done")) << b2.out;
  expect_same_weights_and_momentum((d / "a" / "ckpt-00000016.h5").string(),
                                   (d / "b" / "ckpt-00000016.h5").string());
  auto ids_a = read_sample_log(rank_files(d / "a.ids", 2));
  auto ids_b = read_sample_log(rank_files(d / "b.ids", 2));
  ASSERT_EQ(ids_a.size(), 16u);
  ASSERT_EQ(ids_b.size(), 16u);
  for (auto& [step, runs] : ids_b) {
    ASSERT_EQ(runs.size(), 1u) << "step " << step << " was trained twice";
    EXPECT_EQ(runs[0], ids_a[step][0]) << "step " << step;
  }
}

// Elastic: a checkpoint taken on 2 ranks (global batch 32) resumes on 1 rank (the per-rank
// batch 16 kept, 2 micro-batches per step) and on 4 ranks (8 each): the global batches continue
// in exactly the order of the uninterrupted job (the one rank's two micro-batches are the two
// ranks' batches), and training finishes.
TEST(MpiResume, TwoRankCheckpointResumesOnOneAndFourRanks) {
  fs::path d = fresh_dir("spotrain_mpi_elastic");
  SampleLog ids_a;
  ASSERT_NO_FATAL_FAILURE(run_straight_and_stopped_after_4(d, 2, "--batch-size 16", ids_a));
  for (int world : {1, 4}) {
    SCOPED_TRACE(std::to_string(world) + " rank(s)");
    fs::path w = d / ("w" + std::to_string(world));
    fs::copy(d / "s", w);
    std::string log = "SPOTRAIN_SAMPLE_LOG=" + (d / ("w" + std::to_string(world) + ".ids")).string();
    Launch r = run(mpirun(world, log) + " " + resume_args(w, "--batch-size 16 --resume auto"));
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_TRUE(contains(r.out, world == 1 ? "per-rank batch 16 x 2 micro-batches keeps its global batch "
                                             "of 32 with --accum-steps 2"
                                           : "per-rank batch 8 keeps its global batch of 32 with --accum-steps 1"))
        << r.out;
    EXPECT_TRUE(contains(r.out, "step 16/16")) << r.out;
    auto ids = world == 1 ? read_sample_log({(d / "w1.ids").string()})
                          : read_sample_log(rank_files(d / "w4.ids", 4));
    ASSERT_NO_FATAL_FAILURE(expect_steps_5_to_16_as_straight(ids, ids_a));
  }
  // A rank count that does not divide the global batch is refused clearly, naming those that do.
  fs::copy(d / "s", d / "w3");
  Launch r3 = run(mpirun(3) + " " + resume_args(d / "w3", "--batch-size 16 --resume auto"));
  EXPECT_NE(r3.code, 0);
  EXPECT_TRUE(contains(r3.out, "does not divide over 3 ranks")) << r3.out;
  EXPECT_TRUE(contains(r3.out, "It divides over 1, 2, 4, 8, 16 or 32 ranks")) << r3.out;
}

// A fleet shrunk by half keeps each rank's memory: a checkpoint of 4 ranks x 8 resumes on 2
// ranks at --batch-size 8 with 2 micro-batches per step (K doubled, not the per-rank batch), the
// global batches in the uninterrupted job's order.
TEST(MpiResume, FourRanksShrunkToTwoKeepTheirBatchAndDoubleTheMicroBatches) {
  fs::path d = fresh_dir("spotrain_mpi_shrink");
  SampleLog ids_a;
  ASSERT_NO_FATAL_FAILURE(run_straight_and_stopped_after_4(d, 4, "--batch-size 8", ids_a));
  Launch r = run(mpirun(2, "SPOTRAIN_SAMPLE_LOG=" + (d / "r.ids").string()) + " " +
                 resume_args(d / "s", "--batch-size 8 --resume auto"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "per-rank batch 8 x 2 micro-batches keeps its global batch of 32 with --accum-steps 2"))
      << r.out;
  EXPECT_TRUE(contains(r.out, "batch 8 x 2 micro-batches per step")) << r.out;
  EXPECT_TRUE(contains(r.out, "step 16/16")) << r.out;
  expect_steps_5_to_16_as_straight(read_sample_log(rank_files(d / "r.ids", 2)), ids_a);
}

// Gradient accumulation: one rank with 2 micro-batches of 8 per step trains as 2 ranks with
// batches of 8 do: each micro-batch holds the samples of one of the two ranks, and the weights
// and momentum end the same bit for bit (the two-rank all-reduce adds two gradients, which one
// rank adds too: a + b == b + a in IEEE arithmetic, and both scale the sum by 1/2).
TEST(Accumulation, OneRankWithTwoMicroBatchesTrainsAsTwoRanks) {
  fs::path d = fresh_dir("spotrain_accum_ranks");
  const std::string args = " --steps 12 --no-eval-each-epoch --batch-size 8";
  Launch two = run(mpirun(2, "SPOTRAIN_SAMPLE_LOG=" + (d / "two.ids").string()) + " " +
                   resume_args(d / "two", args));
  ASSERT_EQ(two.code, 0) << two.out;
  Launch one = run(mpirun(1, "SPOTRAIN_SAMPLE_LOG=" + (d / "one.ids").string()) + " " +
                   resume_args(d / "one", args + " --accum-steps 2"));
  ASSERT_EQ(one.code, 0) << one.out;
  auto ids_two = read_sample_log(rank_files(d / "two.ids", 2));
  auto ids_one = read_sample_log({(d / "one.ids").string()});
  ASSERT_EQ(ids_one.size(), 12u);
  for (auto& [step, runs] : ids_one) {
    ASSERT_EQ(runs.size(), 1u);
    EXPECT_EQ(runs[0], ids_two[step][0]) << "step " << step;
  }
  CkptState a = load_ckpt_state((d / "two" / "ckpt-00000012.h5").string());
  CkptState b = load_ckpt_state((d / "one" / "ckpt-00000012.h5").string());
  ASSERT_EQ(a.params.size(), b.params.size());
  double worst = 0;
  for (size_t i = 0; i < a.params.size(); ++i)
    worst = std::max(worst, double(std::fabs(a.params[i] - b.params[i])));
  EXPECT_EQ(std::memcmp(a.params.data(), b.params.data(), a.params.size() * 4), 0)
      << "largest weight difference " << worst;
  EXPECT_EQ(std::memcmp(a.momentum.data(), b.momentum.data(), a.momentum.size() * 4), 0);
  // The running statistics too: the accumulated run keeps those of its first micro-batch, as
  // the two-rank run keeps rank 0's.
  ASSERT_EQ(a.buffers.size(), b.buffers.size());
  ASSERT_FALSE(a.buffers.empty());
  EXPECT_EQ(std::memcmp(a.buffers.data(), b.buffers.data(), a.buffers.size() * 4), 0);
}

// A scheduler's stop reaches the launcher, not the ranks: SIGTERM to examples/resnet50/launch/
// mpirun.sh (the documented way to launch) must give the agreed stop, not Open MPI's kill.
// Steps of a few seconds (resnet20, batch 768 per rank, one thread: longer than the second
// after which Open MPI's mpirun kills ranks it sent SIGTERM), the signal sent just after a
// step's progress line, so it lands mid-step.
struct LauncherStop {
  Launch launch;
  int64_t stopped_after = -1;
};

std::string launcher(const fs::path& dir, const std::string& env = "") {
  std::ofstream(dir / "hosts") << "localhost slots=2\n";
  return "env " + env + " RANKS_PER_NODE=2 THREADS_PER_RANK=1 MPIRUN=" + MPIEXEC_EXECUTABLE +
         " SPOTRAIN=" + SPOTRAIN_BIN + " " + SPOTRAIN_SOURCE_DIR +
         "/examples/resnet50/launch/mpirun.sh " + (dir / "hosts").string() + " 2";
}

std::string launcher_args(const fs::path& ckpt, const std::string& more = "") {
  return " --model resnet20 --data synthetic --train-limit 8192 --test-limit 64 --steps 6"
         " --batch-size 768 --deterministic --log-every 1 --keep 100 --ckpt-dir " +
         ckpt.string() + " " + more;
}

// Starts the launcher, waits for `ready` in its output, sends it SIGTERM, waits for its exit.
LauncherStop stop_launcher(const fs::path& dir, const std::string& launch, const std::string& ready) {
  fs::path log = dir / "launch.log", script = dir / "stop.sh";
  std::ofstream(script) << "(" << launch << ") > " << log.string() << " 2>&1 &\n"
                        << "pid=$!\n"
                        << "while ! grep -qF -e '" << ready << "' " << log.string()
                        << " && kill -0 $pid 2>/dev/null; do sleep 0.1; done\n"
                        << "kill -TERM $pid\nwait $pid\nrc=$?\ncat " << log.string()
                        << "\nexit $rc\n";
  LauncherStop r;
  r.launch = run("sh " + script.string());
  std::smatch m;
  // The launcher passes its SIGTERM on to mpirun as SIGUSR1 (which mpirun forwards to every rank).
  if (std::regex_search(r.launch.out, m, std::regex("stopped by SIGUSR1 after step (\\d+)")))
    r.stopped_after = std::stoll(m[1]);
  return r;
}

void expect_resumes_bitwise(const fs::path& d, const fs::path& stopped, const LauncherStop& s) {
  EXPECT_EQ(s.launch.code, 75) << s.launch.out;
  ASSERT_GT(s.stopped_after, 0) << s.launch.out;
  ASSERT_LT(s.stopped_after, 6) << s.launch.out;
  char name[32];
  std::snprintf(name, sizeof name, "ckpt-%08lld.h5", static_cast<long long>(s.stopped_after));
  Launch v = run(std::string(SPOTRAIN_BIN) + " ckpt verify " + (stopped / name).string());
  EXPECT_EQ(v.code, 0) << "the stop checkpoint " << name << " does not verify:\n" << v.out;
  for (auto& e : fs::directory_iterator(stopped))
    EXPECT_NE(e.path().extension(), ".tmp") << "left behind: " << e.path();
  // Resumed, the job ends where an uninterrupted one does, bit for bit.
  Launch ref = run(launcher(d) + launcher_args(d / "ref", "--ckpt-every 2"));
  ASSERT_EQ(ref.code, 0) << ref.out;
  EXPECT_TRUE(contains(ref.out, "a stop takes about")) << "the stop's cost is logged:\n" << ref.out;
  Launch res = run(launcher(d) + launcher_args(stopped, "--resume auto"));
  ASSERT_EQ(res.code, 0) << res.out;
  expect_same_weights_and_momentum((d / "ref" / "ckpt-00000006.h5").string(),
                                   (stopped / "ckpt-00000006.h5").string());
}

TEST(LauncherStop, SigtermToTheLauncherMidStepGivesTheAgreedStop) {
  fs::path d = fresh_dir("spotrain_launcher_stop");
  // Each step 1 s or more (SPOTRAIN_STEP_DELAY), however fast the machine: the signal, passed on
  // by the launcher and mpirun, reaches the ranks within step 3 or 4.
  LauncherStop s = stop_launcher(d, launcher(d, "SPOTRAIN_STEP_DELAY=1 EXTRA_ENV=SPOTRAIN_STEP_DELAY") +
                                        launcher_args(d / "b"), "step 2/6");
  // Sent as step 3 began: the ranks agree on it with step 3's all-reduce (step 4's, if the
  // signal reached a rank after that one on a slow machine).
  EXPECT_GE(s.stopped_after, 3) << s.launch.out;
  EXPECT_LE(s.stopped_after, 4) << s.launch.out;
  expect_resumes_bitwise(d, d / "b", s);
}

// The same while a background checkpoint write is under way (paused half-way by the test hook
// SPOTRAIN_CKPT_WRITE_DELAY): the stop waits for it, then writes its own.
TEST(LauncherStop, SigtermDuringABackgroundWriteGivesTheAgreedStop) {
  fs::path d = fresh_dir("spotrain_launcher_stop_write");
  LauncherStop s = stop_launcher(
      d,
      launcher(d, "SPOTRAIN_CKPT_WRITE_DELAY=4:2 EXTRA_ENV=SPOTRAIN_CKPT_WRITE_DELAY") +
          launcher_args(d / "b", "--ckpt-every 2"),
      "ckpt-00000002.h5: training held");
  EXPECT_TRUE(fs::exists(d / "b" / "ckpt-00000002.h5")) << s.launch.out;
  expect_resumes_bitwise(d, d / "b", s);
}

}  // namespace

// MAX_RESTARTS: the launcher reruns a job that stopped itself (75) with --resume latest (it
// showed a checkpoint), and the run folder's metrics record the resume; a job that keeps
// losing a peer (76) is retried at most MAX_RESTARTS times and the launcher then gives up
// with 76.
std::string restart_args(const fs::path& ckpt, const std::string& more = "") {
  return " --model resnet20 --data synthetic --train-limit 256 --test-limit 32 --steps 6"
         " --batch-size 16 --log-every 1 --ckpt-every 2 --ckpt-dir " + ckpt.string() + " " + more;
}

TEST(LauncherRestart, AStoppedJobIsRestartedAndResumes) {
  fs::path d = fresh_dir("spotrain_launcher_restart");
  // Stopped three times (a signal to rank 0 at steps 2, 4 and 5), restarted three times.
  // --new-run on the first launch must not reach the restarts (it would move the run aside).
  Launch r = run(launcher(d, "MAX_RESTARTS=3 RESTART_DELAY=0 SPOTRAIN_FAULT=term:0:2,term:0:4,term:0:5") +
                 restart_args(d / "run", "--new-run"));
  ASSERT_EQ(r.code, 0) << r.out;
  for (int s : {2, 4, 5})
    EXPECT_TRUE(contains(r.out, "stopped by SIGTERM after step " + std::to_string(s))) << r.out;
  EXPECT_TRUE(contains(r.out, "mpirun.sh: the job ended with 75; restart 3 of 3")) << r.out;
  // The job showed its checkpoints: the restarts must find one, never start over.
  EXPECT_TRUE(std::regex_search(r.out, std::regex("\\+ [^\\n]* train [^\\n]*--resume latest"))) << r.out;
  EXPECT_FALSE(std::regex_search(r.out, std::regex("\\+ [^\\n]* train [^\\n]*--resume auto"))) << r.out;
  EXPECT_TRUE(contains(r.out, "resumed from " + (d / "run" / "ckpt-00000005.h5").string())) << r.out;
  // The run folder's metrics: one history across the four processes, in order. Each stop is
  // followed by a resume from that stop's step and checkpoint, every step is recorded exactly
  // once and in order, and the wall-clock times never go back.
  std::ifstream m(d / "run" / "metrics.jsonl");
  std::vector<int64_t> steps;
  int resumes = 0;
  std::string last_time;
  nlohmann::json last_stop;
  for (std::string line; std::getline(m, line);) {
    auto j = nlohmann::json::parse(line);  // throws on a torn or merged line
    ASSERT_TRUE(j.contains("time") && j.contains("elapsed")) << line;
    EXPECT_GE(j["time"].get<std::string>(), last_time) << line;
    last_time = j["time"].get<std::string>();
    const std::string type = j["type"];
    if (type == "step") steps.push_back(j["step"].get<int64_t>());
    if (type == "stop") last_stop = j;
    if (type == "resume") {
      ++resumes;
      ASSERT_FALSE(last_stop.is_null()) << "a resume without a stop before it: " << line;
      EXPECT_EQ(j["step"], last_stop["step"]) << line;
      EXPECT_EQ(j["checkpoint"], last_stop["checkpoint"]) << line;
      EXPECT_EQ(j["previous"], "stopped by SIGTERM") << line;
      last_stop = nlohmann::json();
    }
  }
  EXPECT_EQ(resumes, 3);
  EXPECT_EQ(steps, (std::vector<int64_t>{1, 2, 3, 4, 5, 6})) << "every step once, in order";
}

TEST(LauncherRestart, ALostPeerIsRetriedAtMostMaxRestartsTimes) {
  fs::path d = fresh_dir("spotrain_launcher_retry");
  // OOB_KEEPALIVE 1 1 1: a rank that timed out leaves the runtime 1 + 1 x 1 + 2 s to end the job
  // before it aborts (a hung rank on a live node: the runtime does not, so each try ends
  // --comm-timeout + 4 s after the hang).
  Launch r = run(launcher(d, "MAX_RESTARTS=2 RESTART_DELAY=0 OOB_KEEPALIVE='1 1 1' SPOTRAIN_FAULT=hang:1:3") +
                 restart_args(d / "run", "--comm-timeout 4"));
  EXPECT_EQ(r.code, 76) << r.out;
  EXPECT_TRUE(contains(r.out, "the job ended with 76; restart 1 of 2")) << r.out;
  EXPECT_TRUE(contains(r.out, "the job ended with 76; restart 2 of 2")) << r.out;
  EXPECT_FALSE(contains(r.out, "restart 3")) << r.out;
  EXPECT_TRUE(contains(r.out, "resumed from " + (d / "run" / "ckpt-00000002.h5").string())) << r.out;
  // The last line says the launcher gave up, and names the first failure the job printed.
  std::string out = r.out;
  while (!out.empty() && out.back() == '\n') out.pop_back();
  const std::string last = out.substr(out.rfind('\n') + 1);
  EXPECT_EQ(last.rfind("mpirun.sh: gave up after 2 restart(s)", 0), 0u) << last;
  EXPECT_TRUE(contains(last, "the first failure: ")) << last;
  EXPECT_TRUE(contains(last, "step 3")) << last;
}

// A preemption notice (here a file both ranks watch) stops every rank after the same step, with
// a verified checkpoint and 75 from the launcher.
TEST(PreemptNotice, EveryRankStopsAfterTheSameStep) {
  fs::path d = fresh_dir("spotrain_notice_mpi");
  const fs::path notice = d / "notice";
  std::ofstream(d / "run.sh")
      << "(" << mpirun(2) << " " << SPOTRAIN_BIN
      << " train --model resnet20 --data synthetic --train-limit 4096 --test-limit 32 --steps 200"
         " --batch-size 16 --threads 1 --log-every 1 --ckpt-dir " << (d / "run").string()
      << " --preempt-notice file:" << notice.string() << " --preempt-poll 0.05) > "
      << (d / "out").string() << " 2>&1 &\npid=$!\n"
      << "while ! grep -q 'step 3/' " << (d / "out").string()
      << " && kill -0 $pid 2>/dev/null; do sleep 0.05; done\n"
      << "touch " << notice.string() << "\nwait $pid\nrc=$?\ncat " << (d / "out").string()
      << "\nexit $rc\n";
  Launch r = run("sh " + (d / "run.sh").string());
  EXPECT_EQ(r.code, 75) << r.out;
  EXPECT_GE(count(r.out, "preemption notice (file " + notice.string() + "): stopping"), 1) << r.out;
  // Rank 0 names the notice, or, when another rank saw it first, that rank's request; either
  // way every rank stopped after that step (mpirun returns 75 only when all did).
  std::smatch m;
  ASSERT_TRUE(std::regex_search(
      r.out, m, std::regex("stopped by (a preemption notice .*|a stop request on another rank) after step (\\d+)")))
      << r.out;
  char name[32];
  std::snprintf(name, sizeof name, "ckpt-%08d.h5", std::stoi(m[2]));
  Launch v = run(std::string(SPOTRAIN_BIN) + " ckpt verify " + (d / "run" / name).string());
  EXPECT_EQ(v.code, 0) << v.out;
}

// The Kubernetes worker's main process (examples/resnet50/launch/worker.sh): a SIGTERM to it
// (the pod's) reaches its spotrain ranks as the stop signal, so the job stops with a verified
// checkpoint and 75, and then the worker ends its daemon (here `sleep`, standing in for sshd)
// and exits 143 (128 + SIGTERM: a failed container, which the pod's restartPolicy OnFailure
// restarts, where 0 would leave the pod Succeeded and never replaced). In a PID namespace of its own, so that its pkill sees only this job's ranks.
TEST(KubernetesWorker, ASigtermToThePodStopsItsRanksWithACheckpoint) {
  if (run("unshare --pid --fork --mount-proc true").code != 0)
    GTEST_SKIP() << "needs unshare --pid (root) to isolate the worker's ranks";
  fs::path d = fresh_dir("spotrain_k8s_worker");
  const std::string log = (d / "out").string();
  std::ofstream(d / "pod.sh")
      << "SSHD='sleep 600' " << SPOTRAIN_SOURCE_DIR << "/examples/resnet50/launch/worker.sh &\n"
      << "worker=$!\n(" << mpirun(2) << " " << SPOTRAIN_BIN
      << " train --model resnet20 --data synthetic --train-limit 4096 --test-limit 32 --steps 200"
         " --batch-size 16 --threads 1 --log-every 1 --ckpt-dir " << (d / "run").string()
      << ") > " << log << " 2>&1 &\njob=$!\n"
      << "while ! grep -q 'step 3/' " << log << " && kill -0 $job 2>/dev/null; do sleep 0.05; done\n"
      << "kill -TERM $worker\nwait $job\nrc=$?\nwait $worker\necho \"worker exit $?\"\n"
      << "cat " << log << "\nexit $rc\n";
  Launch r = run("unshare --pid --fork --mount-proc sh " + (d / "pod.sh").string());
  EXPECT_EQ(r.code, 75) << r.out;
  EXPECT_TRUE(contains(r.out, "spotrain-worker: stop signal")) << r.out;
  EXPECT_TRUE(contains(r.out, "worker exit 143")) << r.out;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.out, m, std::regex("stopped by SIGTERM after step (\\d+)"))) << r.out;
  char name[32];
  std::snprintf(name, sizeof name, "ckpt-%08d.h5", std::stoi(m[1]));
  Launch v = run(std::string(SPOTRAIN_BIN) + " ckpt verify " + (d / "run" / name).string());
  EXPECT_EQ(v.code, 0) << v.out;
}
