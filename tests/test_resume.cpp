// Exact resume after a preemption: run A trains straight through; run B gets SIGTERM (the
// SPOTRAIN_FAULT=term hook) mid-epoch, writes a checkpoint and exits 75, then resumes with
// --resume auto. The logged losses after the stop, the final weights and the momentum of A
// and B must be bitwise identical.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include "checkpoints/checkpoint.h"
#include "ckpt_state.h"
#include "core/error.h"
#include "run/resume.h"
#include "run_command.h"
#include "scratch_dir.h"
#include <hdf5.h>
#include <signal.h>
#include <thread>

namespace fs = std::filesystem;
using namespace spotrain;

namespace {

struct Out {
  int code = -1;
  std::string text;
};

Out run(const std::string& env, const std::string& args) {
  CommandResult c = run_command(env + " " + std::string(SPOTRAIN_BIN) + " " + args);
  return Out{c.code, c.out};
}

// step -> the logged loss, exactly as written
std::map<int64_t, std::string> step_losses(const fs::path& metrics) {
  std::map<int64_t, std::string> m;
  std::ifstream f(metrics);
  std::string line;
  while (std::getline(f, line)) {
    auto j = nlohmann::json::parse(line);
    if (j["type"] == "step") m[j["step"].get<int64_t>()] = j["loss"].dump();
  }
  return m;
}

// A straight run (d/a) and an interrupted, resumed one (d/b) end alike: the checkpoint `last`
// of each holds the same weights and momentum, bit for bit, and the two trained the same
// samples in the same order (SPOTRAIN_SAMPLE_LOG d/a.ids and d/b.ids): `steps` steps of
// `per_step` samples each, none trained twice, none skipped.
void expect_same_end_and_samples(const fs::path& d, const std::string& last, size_t steps, size_t per_step) {
  expect_same_weights_and_momentum((d / "a" / last).string(), (d / "b" / last).string());
  auto ids_a = read_sample_log({(d / "a.ids").string()});
  auto ids_b = read_sample_log({(d / "b.ids").string()});
  ASSERT_EQ(ids_a.size(), steps);
  ASSERT_EQ(ids_b.size(), steps);
  for (auto& [step, runs] : ids_b) {
    ASSERT_EQ(runs.size(), 1u) << "step " << step << " was trained twice";
    ASSERT_EQ(runs[0].size(), per_step);
    EXPECT_EQ(runs[0], ids_a[step][0]) << "step " << step;
  }
}

// The three runs of a resume check under `d`, each `common` with its --ckpt-dir: a straight one
// (d/a, metrics d/a.jsonl), one stopped by SIGTERM after step `stop` (d/b, exit 75, its stop
// checkpoint written; metrics d/b1.jsonl) and its --resume auto continuation (d/b, metrics
// d/b2.jsonl). With `sample_logs`, the runs into d/a and d/b log their samples to d/a.ids and
// d/b.ids (SPOTRAIN_SAMPLE_LOG).
struct ResumeRuns {
  Out a, b1, b2;
};
void run_straight_stopped_and_resumed(const fs::path& d, const std::string& common, int stop,
                                      ResumeRuns& out, bool sample_logs = false) {
  const std::string env_a = sample_logs ? "SPOTRAIN_SAMPLE_LOG=" + (d / "a.ids").string() : "";
  const std::string env_b = sample_logs ? "SPOTRAIN_SAMPLE_LOG=" + (d / "b.ids").string() : "";
  const std::string into_b = common + "--ckpt-dir " + (d / "b").string() + " --metrics ";
  out.a = run(env_a, common + "--ckpt-dir " + (d / "a").string() + " --metrics " + (d / "a.jsonl").string());
  ASSERT_EQ(out.a.code, 0) << out.a.text;
  out.b1 = run(env_b + " SPOTRAIN_FAULT=term:0:" + std::to_string(stop), into_b + (d / "b1.jsonl").string());
  ASSERT_EQ(out.b1.code, 75) << out.b1.text;
  char stop_ckpt[32];
  std::snprintf(stop_ckpt, sizeof stop_ckpt, "ckpt-%08d.h5", stop);
  ASSERT_TRUE(fs::exists(d / "b" / stop_ckpt)) << out.b1.text;
  out.b2 = run(env_b, into_b + (d / "b2.jsonl").string() + " --resume auto");
  ASSERT_EQ(out.b2.code, 0) << out.b2.text;
}

// The continuation (d/b2.jsonl) logged `steps` steps, each with the very loss the straight run
// (d/a.jsonl) logged for it.
void expect_resumed_losses_as_straight(const fs::path& d, size_t steps) {
  auto la = step_losses(d / "a.jsonl"), lb = step_losses(d / "b2.jsonl");
  ASSERT_EQ(lb.size(), steps);
  for (auto& [step, loss] : lb) EXPECT_EQ(loss, la[step]) << "step " << step;
}

// `common` (which names the --ckpt-dir) run to `steps` with --resume auto finishes, saying
// `note`, resumed from the checkpoint `from`.
void expect_resumes_from(const std::string& common, int steps, const std::string& note, const fs::path& from) {
  Out r = run("", common + " --steps " + std::to_string(steps) + " --resume auto");
  ASSERT_EQ(r.code, 0) << r.text;
  EXPECT_NE(r.text.find(note), std::string::npos) << r.text;
  EXPECT_NE(r.text.find("resumed from " + from.string()), std::string::npos) << r.text;
}

// The checkpoint name that the folder's `latest` file holds.
std::string latest_in(const fs::path& d) {
  std::ifstream latest(d / "latest");
  std::string name;
  latest >> name;
  return name;
}

}  // namespace

TEST(Resume, InterruptedRunContinuesBitwiseIdentically) {
  if (!fs::exists("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz"))
    GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  const fs::path d = fresh_dir("spotrain_resume");
  std::string common =
      "train --model resnet20 --data fashion-mnist --train-limit 1024 --test-limit 500 "
      "--batch-size 32 --epochs 2 --log-every 4 --threads 2 --deterministic ";
  // 32 steps per epoch: step 40 is mid-way through the second epoch.
  ResumeRuns r;
  ASSERT_NO_FATAL_FAILURE(run_straight_stopped_and_resumed(d, common, 40, r, /*sample_logs=*/true));
  EXPECT_NE(r.b2.text.find("resumed from"), std::string::npos) << r.b2.text;
  EXPECT_NE(r.b2.text.find("step 40, 1 epoch and 8 batches done"), std::string::npos) << r.b2.text;

  auto la = step_losses(d / "a.jsonl"), lb1 = step_losses(d / "b1.jsonl"),
       lb2 = step_losses(d / "b2.jsonl");
  ASSERT_FALSE(lb2.empty());
  for (auto& [step, loss] : lb1) EXPECT_EQ(loss, la[step]) << "step " << step;
  for (auto& [step, loss] : lb2) {
    EXPECT_GT(step, 40);
    EXPECT_EQ(loss, la[step]) << "step " << step;
  }
  // Data order: the interrupted run consumed exactly the samples of the straight one, in
  // the same order, none repeated (each step trained once) and none skipped.
  expect_same_end_and_samples(d, "ckpt-00000064.h5", 64, 32);
}

// The same with fp16 dynamic loss scaling on a small synthetic run: the scaler state
// (scale, good/skipped step counts) comes back exactly, so the continuation is bitwise.
TEST(Resume, Fp16LossScalerStateResumesBitwise) {
  const fs::path d = fresh_dir("spotrain_resume_fp16");
  std::string common =
      "train --model resnet20 --data synthetic --train-limit 256 --test-limit 64 --batch-size 16 "
      "--epochs 2 --precision fp16 --log-every 1 --threads 1 --deterministic --keep 100 ";
  ResumeRuns r;
  ASSERT_NO_FATAL_FAILURE(run_straight_stopped_and_resumed(d, common, 11, r));
  EXPECT_NE(r.b2.text.find("step 11, 0 epochs and 11 batches done"), std::string::npos) << r.b2.text;
  expect_resumed_losses_as_straight(d, 21);
  CheckpointInfo ia = read_checkpoint_info((d / "a" / "ckpt-00000032.h5").string());
  CheckpointInfo ib = read_checkpoint_info((d / "b" / "ckpt-00000032.h5").string());
  CheckpointInfo i11 = read_checkpoint_info((d / "b" / "ckpt-00000011.h5").string());
  EXPECT_EQ(ia.scaler.scale, ib.scaler.scale);
  EXPECT_EQ(ia.scaler.good_steps, ib.scaler.good_steps);
  EXPECT_EQ(ia.scaler.skipped_steps, ib.scaler.skipped_steps);
  EXPECT_GT(i11.scaler.good_steps + i11.scaler.skipped_steps, 0) << "the scaler state was saved";
  expect_same_weights_and_momentum((d / "a" / "ckpt-00000032.h5").string(),
                                   (d / "b" / "ckpt-00000032.h5").string());
}

// LARS with the poly schedule (a warm-up, then the decay to --lr-end) resumes bitwise: the
// momentum (which holds LARS's scaled learning rate inside), the step count and the schedule's
// place come back exactly. The checkpoint records the optimizer, in its config and its
// optimizer group.
TEST(Resume, LarsWithPolyScheduleResumesBitwise) {
  const fs::path d = fresh_dir("spotrain_resume_lars");
  std::string common =
      "train --model resnet20 --data synthetic --train-limit 256 --test-limit 64 --batch-size 16 "
      "--epochs 2 --optimizer lars --lars-trust 0.002 --lr 1.5 --lr-schedule poly --warmup-epochs 0.5 "
      "--lr-end 0.001 --log-every 1 --threads 1 --deterministic --keep 100 ";
  ResumeRuns r;
  ASSERT_NO_FATAL_FAILURE(run_straight_stopped_and_resumed(d, common, 11, r));
  EXPECT_NE(r.a.text.find("optimizer LARS"), std::string::npos) << r.a.text;
  EXPECT_NE(r.b2.text.find("step 11, 0 epochs and 11 batches done"), std::string::npos) << r.b2.text;
  expect_resumed_losses_as_straight(d, 21);
  const std::string last = (d / "a" / "ckpt-00000032.h5").string();
  expect_same_weights_and_momentum(last, (d / "b" / "ckpt-00000032.h5").string());
  const CheckpointInfo info = read_checkpoint_info(last);
  EXPECT_EQ(info.optimizer_kind, "lars");
  const auto config = nlohmann::json::parse(info.config_json);
  EXPECT_EQ(config["optimizer"], "lars");
  EXPECT_EQ(config["lr_schedule"], "poly");
  EXPECT_EQ(config["lars_trust"].get<double>(), 0.002);
}

// A checkpoint resumed with the other --optimizer is refused in one line that says which it was
// trained with (their momentum buffers mean different things), both ways.
TEST(Resume, AnotherOptimizerIsRefused) {
  fs::path d = fs::temp_directory_path() / "spotrain_resume_optimizer";
  fs::remove_all(d);
  const std::string common = "train --model resnet20 --data synthetic --train-limit 64 "
                             "--batch-size 16 --threads 1 ";
  for (const auto& [trained, asked] : {std::pair<std::string, std::string>{"sgd", "lars"},
                                       std::pair<std::string, std::string>{"lars", "sgd"}}) {
    const fs::path first = d / trained, second = d / (trained + "-then-" + asked);
    Out a = run("", common + "--steps 2 --optimizer " + trained + " --ckpt-dir " + first.string());
    ASSERT_EQ(a.code, 0) << a.text;
    const std::string ckpt = (first / "ckpt-00000002.h5").string();
    EXPECT_EQ(read_checkpoint_info(ckpt).optimizer_kind, trained);
    Out b = run("", common + "--steps 4 --optimizer " + asked + " --ckpt-dir " + second.string() +
                        " --resume " + ckpt);
    EXPECT_EQ(b.code, 1) << b.text;
    EXPECT_NE(b.text.find("error: checkpoint " + ckpt + " was trained with --optimizer " + trained +
                          "; this run asks for " + asked),
              std::string::npos)
        << b.text;
  }
}

// Gradient accumulation (--accum-steps 2, batch 8): a stop mid-epoch at a step boundary, then
// --resume auto, continues bitwise: the same losses after the stop, the same weights and momentum
// at the end, and each step's 16 samples (both micro-batches, in one line) trained once.
TEST(Resume, AccumulatedStepsResumeBitwise) {
  const fs::path d = fresh_dir("spotrain_resume_accum");
  std::string common =
      "train --model resnet20 --data synthetic --train-limit 128 --test-limit 32 --batch-size 8 "
      "--accum-steps 2 --epochs 2 --log-every 1 --threads 1 --deterministic --keep 100 ";
  // 8 steps of 16 images per epoch: step 5 is mid-way through the first.
  ResumeRuns r;
  ASSERT_NO_FATAL_FAILURE(run_straight_stopped_and_resumed(d, common, 5, r, /*sample_logs=*/true));
  EXPECT_NE(r.a.text.find("batch 8 x 2 micro-batches per step (--accum-steps; global batch 16)"),
            std::string::npos) << r.a.text;
  EXPECT_NE(r.b2.text.find("step 5, 0 epochs and 5 batches done"), std::string::npos) << r.b2.text;
  EXPECT_EQ(r.b2.text.find("overridden"), std::string::npos) << "same ranks, same split:\n" << r.b2.text;
  expect_resumed_losses_as_straight(d, 11);
  EXPECT_EQ(read_checkpoint_info((d / "b" / "ckpt-00000005.h5").string()).global_batch, 16);
  expect_same_end_and_samples(d, "ckpt-00000016.h5", 16, 16);
}

// SIGKILL while a checkpoint is being written (the write-delay hook holds the write of
// step 4 half way): the previous checkpoint and `latest` stay intact, and --resume auto
// continues from it, removing the half-written file.
TEST(Resume, KillDuringWriteKeepsThePreviousCheckpoint) {
  const fs::path d = fresh_dir("spotrain_resume_kill");
  std::string common = "train --data synthetic --train-limit 128 --batch-size 16 --threads 1 "
                       "--ckpt-every 2 --ckpt-dir " + d.string();
  std::string pidfile = (d / "pid").string();
  std::string cmd = "SPOTRAIN_CKPT_WRITE_DELAY=600:4 " + std::string(SPOTRAIN_BIN) + " " + common +
                    " --steps 6 > " + (d / "log").string() + " 2>&1 & echo $! > " + pidfile;
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  fs::path tmp = d / "ckpt-00000004.h5.tmp";
  for (int i = 0; i < 600 && !fs::exists(tmp); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  std::ifstream pf(pidfile);
  int pid = 0;
  pf >> pid;
  ASSERT_GT(pid, 0);
  ASSERT_TRUE(fs::exists(tmp)) << "the delayed write never started";
  kill(pid, SIGKILL);
  for (int i = 0; i < 100 && kill(pid, 0) == 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(fs::exists(d / "ckpt-00000004.h5"));
  ASSERT_TRUE(fs::exists(d / "ckpt-00000002.h5"));
  EXPECT_EQ(latest_in(d), "ckpt-00000002.h5");
  EXPECT_EQ(run("", "ckpt verify " + (d / "ckpt-00000002.h5").string()).code, 0);
  ASSERT_NO_FATAL_FAILURE(
      expect_resumes_from(common, 6, "removing the unfinished checkpoint", d / "ckpt-00000002.h5"));
  EXPECT_FALSE(fs::exists(tmp));
  EXPECT_TRUE(fs::exists(d / "ckpt-00000006.h5"));
}

// A checkpoint from a newer (or invalid) format version is refused with a clear message,
// and --resume auto falls back to the good one before it.
TEST(Resume, WrongFormatVersionIsRefused) {
  fs::path d = fs::temp_directory_path() / "spotrain_resume_version";
  fs::remove_all(d);
  std::string common = "train --data synthetic --train-limit 64 --batch-size 16 --threads 1 "
                       "--ckpt-every 2 --keep 5 --ckpt-dir " + d.string();
  ASSERT_EQ(run("", common + " --steps 4").code, 0);
  {
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    hid_t f = H5Fopen((d / "ckpt-00000004.h5").c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    ASSERT_GE(f, 0);
    hid_t a = H5Aopen(f, "format_version", H5P_DEFAULT);
    int64_t v = 99;
    ASSERT_GE(H5Awrite(a, H5T_NATIVE_INT64, &v), 0);
    H5Aclose(a);
    H5Fclose(f);
  }
  Out v = run("", "ckpt verify " + (d / "ckpt-00000004.h5").string());
  EXPECT_NE(v.code, 0);
  EXPECT_NE(v.text.find("format version 99"), std::string::npos) << v.text;
  expect_resumes_from(common, 6, "skipping unusable checkpoint", d / "ckpt-00000002.h5");
}

// Too little free space for a checkpoint is refused at start (the SPOTRAIN_FREE_BYTES hook
// stands in for a full disk), before any training.
TEST(Resume, FullCheckpointDiskIsRefusedAtStart) {
  fs::path d = fs::temp_directory_path() / "spotrain_resume_full";
  fs::remove_all(d);
  Out r = run("SPOTRAIN_FREE_BYTES=100000", "train --data synthetic --train-limit 64 "
              "--batch-size 16 --steps 2 --threads 1 --ckpt-dir " + d.string());
  EXPECT_EQ(r.code, 1) << r.text;
  EXPECT_NE(r.text.find("free; writing a checkpoint of this model"), std::string::npos) << r.text;
  EXPECT_EQ(r.text.find("step 1/"), std::string::npos) << r.text;
}

TEST(Resume, RefusesAnotherModelsCheckpoint) {
  fs::path d = fs::temp_directory_path() / "spotrain_resume_other";
  fs::remove_all(d);
  Out a = run("", "train --model resnet20 --data synthetic --train-limit 64 --steps 2 "
                  "--batch-size 16 --threads 1 --ckpt-dir " + d.string());
  ASSERT_EQ(a.code, 0) << a.text;
  // A fresh folder, so the run folder's own check (another run's folder) does not answer first:
  // the checkpoint itself is refused for the model it holds.
  const fs::path other = fs::temp_directory_path() / "spotrain_resume_other_32";
  fs::remove_all(other);
  Out b = run("", "train --model resnet32 --data synthetic --train-limit 64 --steps 4 "
                  "--batch-size 16 --threads 1 --ckpt-dir " + other.string() + " --resume " +
                  (d / "ckpt-00000002.h5").string());
  EXPECT_EQ(b.code, 1) << b.text;
  EXPECT_NE(b.text.find("is a resnet20 checkpoint; this run trains resnet32"), std::string::npos) << b.text;
}

TEST(Resume, SignalWithoutCheckpointDirectoryIsAnError) {
  Out r = run("SPOTRAIN_FAULT=term:0:2", "train --data synthetic --train-limit 64 --steps 4 "
                                         "--batch-size 16 --threads 1 --ckpt-dir \"\"");
  EXPECT_EQ(r.code, 1) << r.text;
  EXPECT_NE(r.text.find("nothing was saved"), std::string::npos) << r.text;
}

namespace {
void flip_bytes(const fs::path& p, double where) {
  std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(0, std::ios::end);
  auto size = int64_t(f.tellg());
  for (int64_t off = int64_t(double(size) * where); off < int64_t(double(size) * where) + 64; ++off) {
    f.seekg(off);
    char c;
    f.get(c);
    f.seekp(off);
    f.put(char(c ^ 0x5a));
  }
}
}  // namespace

TEST(Resume, CorruptNewestCheckpointIsReportedAndThePreviousOneUsed) {
  fs::path d = fs::temp_directory_path() / "spotrain_resume_corrupt";
  fs::remove_all(d);
  std::string common = "train --data synthetic --train-limit 64 --batch-size 16 --threads 1 "
                       "--ckpt-every 2 --keep 5 --ckpt-dir " + d.string();
  ASSERT_EQ(run("", common + " --steps 6").code, 0);
  ASSERT_TRUE(fs::exists(d / "ckpt-00000004.h5"));
  EXPECT_EQ(latest_in(d), "ckpt-00000006.h5");
  EXPECT_EQ(run("", "ckpt verify " + (d / "ckpt-00000006.h5").string()).code, 0);

  flip_bytes(d / "ckpt-00000006.h5", 0.6);  // inside the tensor data
  Out v = run("", "ckpt verify " + (d / "ckpt-00000006.h5").string());
  EXPECT_EQ(v.code, 1) << v.text;
  EXPECT_NE(v.text.find("error: "), std::string::npos) << v.text;
  // A truncated file and a file that is not HDF5 at all, both "newer".
  fs::copy_file(d / "ckpt-00000004.h5", d / "ckpt-00000007.h5");
  fs::resize_file(d / "ckpt-00000007.h5", fs::file_size(d / "ckpt-00000007.h5") / 2);
  std::ofstream(d / "ckpt-00000009.h5") << "not a checkpoint";
  expect_resumes_from(common, 8, "warning: skipping unusable checkpoint", d / "ckpt-00000004.h5");
}

TEST(Resume, VerifyRejectsNonCheckpoints) {
  fs::path p = fs::temp_directory_path() / "spotrain_not_a_ckpt.h5";
  std::ofstream(p) << "hello";
  Out v = run("", "ckpt verify " + p.string());
  EXPECT_EQ(v.code, 1) << v.text;
  EXPECT_NE(v.text.find("not an HDF5 file"), std::string::npos) << v.text;
}

TEST(Resume, MaxWallTimeStopsInTimeWithACheckpoint) {
  if (!fs::exists("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz"))
    GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  fs::path d = fs::temp_directory_path() / "spotrain_wall";
  fs::remove_all(d);
  auto t0 = std::chrono::steady_clock::now();
  Out r = run("", "train --data fashion-mnist --train-limit 1024 --test-limit 200 --epochs 500 "
                  "--batch-size 64 --threads 1 --log-every 1000 --max-wall-time 10s --keep 1000 "
                  "--ckpt-dir " + d.string());
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(r.code, 75) << r.text;
  // Without the limit this would train for minutes; allow start-up and exit on a loaded machine.
  EXPECT_LT(secs, 10.0 + 3.0) << r.text;
  EXPECT_NE(r.text.find("stopped by --max-wall-time"), std::string::npos) << r.text;
  const std::string name = latest_in(d);
  ASSERT_FALSE(name.empty());
  EXPECT_EQ(run("", "ckpt verify " + (d / name).string()).code, 0);
}

TEST(Resume, CheckpointAtEveryEpochEnd) {
  fs::path d = fs::temp_directory_path() / "spotrain_epoch_ckpt";
  fs::remove_all(d);
  Out r = run("", "train --data synthetic --train-limit 64 --test-limit 32 --batch-size 16 "
                  "--epochs 2 --threads 1 --keep 10 --ckpt-dir " + d.string());
  ASSERT_EQ(r.code, 0) << r.text;
  EXPECT_TRUE(fs::exists(d / "ckpt-00000004.h5")) << r.text;  // end of epoch 1 (4 steps)
  EXPECT_TRUE(fs::exists(d / "ckpt-00000008.h5")) << r.text;  // end of training
}
