// The command line against bad input: each case must print exactly one `error:` line naming
// the problem and exit non-zero (1 for bad input, 2 for a bad command line), never crash.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <sys/wait.h>
#include <zlib.h>

#include "run_command.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace fs = std::filesystem;

namespace {

struct CmdResult {
  int code = -1;
  std::string out;
};

CmdResult run(const std::string& args) {
  CommandResult c = run_command(std::string(SPOTRAIN_BIN) + " " + args);
  return CmdResult{c.code, c.out};
}

int count_lines_starting(const std::string& s, const std::string& prefix) {
  int n = 0;
  size_t pos = 0;
  while (pos < s.size()) {
    size_t e = s.find('\n', pos);
    if (e == std::string::npos) e = s.size();
    if (s.compare(pos, prefix.size(), prefix) == 0) ++n;
    pos = e + 1;
  }
  return n;
}

void expect_error(const CmdResult& r, int code, const std::string& needle) {
  EXPECT_EQ(r.code, code) << r.out;
  EXPECT_EQ(count_lines_starting(r.out, "error: "), 1) << r.out;
  EXPECT_NE(r.out.find(needle), std::string::npos) << "missing '" << needle << "' in: " << r.out;
}

void write_gz(const fs::path& p, const std::vector<uint8_t>& bytes) {
  gzFile f = gzopen(p.c_str(), "wb");
  gzwrite(f, bytes.data(), unsigned(bytes.size()));
  gzclose(f);
}

std::vector<uint8_t> be32(uint32_t v) {
  return {uint8_t(v >> 24), uint8_t(v >> 16), uint8_t(v >> 8), uint8_t(v)};
}

// A tiny IDX dataset of n 4x4 images; `mutate` may corrupt it.
fs::path make_idx(const std::string& name, int n, uint32_t img_magic = 0x803, int bad_label = -1,
                  int drop_bytes = 0) {
  fs::path dir = fs::temp_directory_path() / ("spotrain_cli_" + name);
  fs::create_directories(dir);
  for (std::string split : {"train", "t10k"}) {
    std::vector<uint8_t> img = be32(img_magic), lab = be32(0x801);
    for (auto v : {be32(n), be32(4), be32(4)}) img.insert(img.end(), v.begin(), v.end());
    auto c = be32(n);
    lab.insert(lab.end(), c.begin(), c.end());
    for (int i = 0; i < n * 16; ++i) img.push_back(uint8_t(i * 7));
    for (int i = 0; i < n; ++i) lab.push_back(uint8_t(i == 1 && bad_label >= 0 ? bad_label : i % 10));
    img.resize(img.size() - drop_bytes);
    write_gz(dir / (split + "-images-idx3-ubyte.gz"), img);
    write_gz(dir / (split + "-labels-idx1-ubyte.gz"), lab);
  }
  return dir;
}

}  // namespace

TEST(Cli, MissingDataset) {
  expect_error(run("train --data fashion-mnist:/nonexistent/fmnist --steps 1"), 1, "/nonexistent/fmnist");
}

TEST(Cli, WrongMagic) {
  auto d = make_idx("magic", 20, 0x1234);
  expect_error(run("train --data fashion-mnist:" + d.string() + " --steps 1"), 1, "magic");
}

TEST(Cli, TruncatedFile) {
  auto d = make_idx("trunc", 20, 0x803, -1, 100);
  expect_error(run("train --data fashion-mnist:" + d.string() + " --steps 1"), 1, "truncated");
}

TEST(Cli, LabelOutOfRange) {
  auto d = make_idx("label", 20, 0x803, 42);
  expect_error(run("train --data fashion-mnist:" + d.string() + " --steps 1"), 1, "label 42");
}

TEST(Cli, UnknownModel) {
  expect_error(run("train --model resnet7 --data synthetic --steps 1"), 1, "unknown model 'resnet7'");
}

// Captured steps are the default and a no-op on the CPU: --cuda-graph trains there, silent
// about capture, and --no-cuda-graph is taken by train and bench alike.
TEST(Cli, CudaGraphOnTheCpuIsANoOp) {
  fs::path dir = fs::temp_directory_path() / "spotrain_cli_graph";
  fs::remove_all(dir);
  for (const char* flag : {"--cuda-graph", "--no-cuda-graph"}) {
    CmdResult r = run("train --data synthetic --train-limit 32 --batch-size 16 --steps 2 "
                      "--device cpu " + std::string(flag) + " --ckpt-dir " + dir.string());
    EXPECT_EQ(r.code, 0) << flag << "\n" << r.out;
    EXPECT_EQ(r.out.find("captured"), std::string::npos) << r.out;
    EXPECT_TRUE(fs::exists(dir / "ckpt-00000002.h5")) << flag;
    fs::remove_all(dir);
    r = run("bench --model resnet20 --image-size 28 --channels 1 --num-classes 10 "
            "--batch-size 4 --warmup 0 --steps 1 --device cpu " + std::string(flag));
    EXPECT_EQ(r.code, 0) << flag << "\n" << r.out;
    EXPECT_EQ(r.out.find("captured"), std::string::npos) << r.out;
    // The CPU times what it was asked to: no warm-up steps added for a recording.
    EXPECT_EQ(r.out.find("warm-up 1"), std::string::npos) << r.out;
  }
}

TEST(Cli, ZeroBatchSize) {
  expect_error(run("train --data synthetic --batch-size 0 --steps 1"), 1, "--batch-size");
}

TEST(Cli, BatchLargerThanDataset) {
  auto d = make_idx("small", 20);
  expect_error(run("train --data fashion-mnist:" + d.string() + " --batch-size 64 --steps 1"), 1,
               "larger than the");
}

TEST(Cli, NegativeLearningRate) {
  expect_error(run("train --data synthetic --lr -0.1 --steps 1"), 1, "--lr");
}

TEST(Cli, UnknownFlagIsACommandLineError) {
  expect_error(run("train --no-such-flag 3"), 2, "no-such-flag");
}

TEST(Cli, MissingSubcommandIsACommandLineError) {
  CmdResult r = run("");
  EXPECT_EQ(r.code, 2) << r.out;
}

TEST(Cli, HelpSucceeds) {
  CmdResult r = run("train --help");
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.out.find("--batch-size"), std::string::npos);
}

// --dry-run: the command line and settings are checked, nothing runs and no file is made.
TEST(Cli, DryRunChecksWithoutRunning) {
  const fs::path d = fs::temp_directory_path() / "spotrain_dry_run";
  fs::remove_all(d);
  CmdResult r = run("train --data synthetic --lr 0.1 --epochs 90 --dry-run --ckpt-dir " + d.string());
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("\nlr = 0.1\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\nepochs = 90\n"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(d)) << "a dry run made the run folder";
  expect_error(run("train --lr -1 --dry-run"), 1, "--lr must not be negative");
  expect_error(run("train --model resnet21 --dry-run"), 1, "unknown model 'resnet21'");
  expect_error(run("train --data imagefolder: --dry-run"), 1, "unknown --data 'imagefolder:'");
  expect_error(run("bench --grad-checkpoint every:0 --dry-run"), 1, "K must be a positive integer");
  expect_error(run("train --bacth-size 4 --dry-run"), 2, "--bacth-size");
  r = run("eval --ckpt /no/such/file.h5 --dry-run");  // parsed only: the file is not opened
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("spotrain eval --dry-run: the command line is valid"), std::string::npos) << r.out;
  expect_error(run("ckpt verify --dry-run"), 2, "file is required");
}

// bench takes the run's settings from train's table: the same choices, checks and exit codes,
// with --dry-run and without.
TEST(Cli, BenchTakesTheRunsSettingsFromTrainsTable) {
  for (const char* cmd : {"train", "bench"}) {
    expect_error(run(std::string(cmd) + " --precision fp17 --dry-run"), 2, "--precision");
    expect_error(run(std::string(cmd) + " --precision fp17"), 2, "--precision");
    expect_error(run(std::string(cmd) + " --device tpu --dry-run"), 2, "--device");
    expect_error(run(std::string(cmd) + " --model resnet21 --dry-run"), 1, "unknown model 'resnet21'");
    expect_error(run(std::string(cmd) + " --max-bad-fraction 2 --dry-run"), 1, "--max-bad-fraction");
  }
  expect_error(run("bench --steps 0 --dry-run"), 1, "--steps must be positive");
  CmdResult train = run("train --help"), bench = run("bench --help");
  for (const char* line : {"--grad-checkpoint TEXT=none none|selective|block|stage|every:K", "--precision TEXT:{"})
    EXPECT_TRUE(train.out.find(line) != std::string::npos && bench.out.find(line) != std::string::npos) << line;
  EXPECT_NE(bench.out.find("--model TEXT=resnet50"), std::string::npos) << "bench's own default";
  EXPECT_NE(bench.out.find("--batch-size INT=32"), std::string::npos) << bench.out;
}

// bench --end-to-end: steps queued back to back and timed together, besides the timed steps.
TEST(Cli, BenchEndToEndTimesQueuedStepsTogether) {
  const fs::path j = fs::temp_directory_path() / "spotrain_bench_e2e.json";
  const std::string args = "bench --model resnet20 --image-size 32 --num-classes 10 --batch-size 8 "
                           "--steps 3 --warmup 1 --threads 1 --json " + j.string();
  CmdResult r = run(args + " --end-to-end");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("images/s end to end (3 steps queued back to back"), std::string::npos) << r.out;
  nlohmann::json doc = nlohmann::json::parse(std::ifstream(j));
  ASSERT_TRUE(doc["images_per_sec_end_to_end"].is_number()) << doc.dump();
  EXPECT_GT(doc["images_per_sec_end_to_end"].get<double>(), 0.0);
  r = run(args);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(r.out.find("end to end"), std::string::npos) << r.out;
  EXPECT_TRUE(nlohmann::json::parse(std::ifstream(j))["images_per_sec_end_to_end"].is_null());
}

TEST(Cli, UnavailableDeviceIsAClearError) {
  // Choices are checked while parsing: exit 2, naming the value and the allowed ones.
  expect_error(run("train --data synthetic --device tpu --steps 1"), 2, "tpu not in {auto,cpu,cuda}");
}

TEST(Cli, TrainsOnTinyDataAndWritesMetrics) {
  auto d = make_idx("ok", 40);
  fs::path m = fs::temp_directory_path() / "spotrain_cli_metrics.jsonl";
  fs::remove(m);
  fs::path ck = fs::temp_directory_path() / "spotrain_cli_ckpt";
  fs::remove_all(ck);
  CmdResult r = run("train --data fashion-mnist:" + d.string() + " --batch-size 8 --epochs 1 --metrics " +
              m.string() + " --log-every 2 --ckpt-dir " + ck.string());
  ASSERT_EQ(r.code, 0) << r.out;
  std::ifstream f(m);
  std::string line, last;  // last: the last epoch record
  int lines = 0;
  while (std::getline(f, line)) {
    ++lines;
    if (line.find("\"type\":\"epoch\"") != std::string::npos) last = line;
  }
  EXPECT_GE(lines, 3);  // 5 steps logged every 2 + the epoch line
  EXPECT_NE(last.find("\"test_top1\""), std::string::npos) << last;
  EXPECT_NE(last.find("\"images_per_sec\""), std::string::npos) << last;
  // The final checkpoint exists and `eval` reproduces the trainer's own test accuracy.
  ASSERT_TRUE(fs::exists(ck / "ckpt-00000005.h5")) << r.out;
  std::string top1 = r.out.substr(r.out.rfind("test top-1 ") + 11);
  top1 = top1.substr(0, top1.find('%'));
  CmdResult e = run("eval --ckpt " + ck.string() + " --data fashion-mnist:" + d.string());
  ASSERT_EQ(e.code, 0) << e.out;
  EXPECT_NE(e.out.find("top-1 " + top1 + "%"), std::string::npos) << e.out << " vs " << top1;
}

// Counts as people count: after two whole epochs a checkpoint says 2 epochs done, in `eval
// --json` (it said "epoch": 1, the 0-based epoch in progress) and in `ckpt info`; one written
// in the middle of an epoch says how many of its batches were done.
TEST(Cli, CheckpointsCountTheEpochsDone) {
  auto d = make_idx("epochs", 40);  // 5 steps an epoch at batch 8
  fs::path ck = fs::temp_directory_path() / "spotrain_cli_epochs_run";
  fs::remove_all(ck);
  CmdResult r = run("train --data fashion-mnist:" + d.string() + " --batch-size 8 --epochs 2 --ckpt-dir " +
                    ck.string() + " --metrics none --log-every 100");
  ASSERT_EQ(r.code, 0) << r.out;
  fs::path js = ck / "eval-final.json";
  CmdResult e = run("eval --ckpt " + ck.string() + " --data fashion-mnist:" + d.string() + " --json " + js.string());
  ASSERT_EQ(e.code, 0) << e.out;
  nlohmann::json j = nlohmann::json::parse(std::ifstream(js));
  EXPECT_EQ(j.value("epochs_done", -1), 2) << j.dump();
  EXPECT_EQ(j.value("batches_into_next_epoch", -1), 0) << j.dump();
  EXPECT_FALSE(j.contains("epoch")) << "a field named for what it holds: " << j.dump();
  CmdResult info = run("ckpt info " + (ck / "ckpt-00000010.h5").string());
  ASSERT_EQ(info.code, 0) << info.out;
  EXPECT_NE(info.out.find("progress      2 epochs done"), std::string::npos) << info.out;
  fs::path mid = fs::temp_directory_path() / "spotrain_cli_epochs_mid";
  fs::remove_all(mid);
  r = run("train --data fashion-mnist:" + d.string() + " --batch-size 8 --steps 7 --ckpt-dir " +
          mid.string() + " --metrics none --log-every 100");
  ASSERT_EQ(r.code, 0) << r.out;
  info = run("ckpt info " + (mid / "ckpt-00000007.h5").string());
  EXPECT_NE(info.out.find("progress      1 epoch and 2 batches done"), std::string::npos) << info.out;
}

TEST(Cli, EvalRejectsMissingAndCorruptCheckpoints) {
  expect_error(run("eval --ckpt /nonexistent/ckpt.h5 --data synthetic"), 1, "does not exist");
  fs::path bad = fs::temp_directory_path() / "spotrain_cli_bad.h5";
  std::ofstream(bad) << "not an hdf5 file";
  expect_error(run("eval --ckpt " + bad.string() + " --data synthetic"), 1, "not an HDF5 file");
  // A folder whose checkpoints are all unusable: the error line (the last line) says why the
  // newest was refused.
  fs::path dir = fs::temp_directory_path() / "spotrain_cli_bad_ckpts";
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::ofstream(dir / "ckpt-00000003.h5") << "not an hdf5 file";
  std::ofstream(dir / "ckpt-00000001.h5") << "nor this";
  CmdResult r = run("eval --ckpt " + dir.string() + " --data synthetic");
  expect_error(r, 1, "2 unusable checkpoint(s) skipped, the newest: ");
  const std::string last = r.out.substr(r.out.rfind("error: "));
  EXPECT_NE(last.find("ckpt-00000003.h5"), std::string::npos) << last;
  EXPECT_NE(last.find("not an HDF5 file"), std::string::npos) << last;
}

TEST(Cli, UnwritableCheckpointDirectoryFailsAtStart) {
  expect_error(run("train --data synthetic --steps 1 --ckpt-dir /proc/spotrain"), 1, "not writable");
}

TEST(Cli, ConfigFileSetsOptionsAndFlagsOverrideIt) {
  fs::path c = fs::temp_directory_path() / "spotrain_cli_config.toml";
  std::ofstream(c) << "[train]\nmodel = \"resnet20\"\ndata = \"synthetic\"\ntrain-limit = 64\n"
                      "steps = 2\nbatch-size = 32\nlog-every = 1\nckpt-dir = \"\"\n";
  CmdResult r = run("train --config " + c.string() + " --batch-size 16");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("batch 16"), std::string::npos) << r.out;      // flag wins
  EXPECT_NE(r.out.find("step 2/2"), std::string::npos) << r.out;      // file's steps
  EXPECT_NE(r.out.find("64 train"), std::string::npos) << r.out;      // file's limit
  expect_error(run("train --config /nonexistent/spotrain.toml"), 2, "spotrain.toml does not exist");
  // A folder opens and reads as empty: it must not train on the defaults.
  expect_error(run("train --config " + fs::temp_directory_path().string()), 2, "is not a file");
}

// Comments go from a '#' outside quotes to the end of the line; a '#' inside a quoted value is
// part of it (CLI11 alone would cut "/runs/a#2" to "/runs/a).
// A value that came from the config file, refused: the error line says which file it is in
// (the user typed no --lr).
TEST(Cli, AConfigValueRefusedNamesTheConfigFile) {
  fs::path cfg = fs::temp_directory_path() / "spotrain_cli_bad_lr.toml";
  std::ofstream(cfg) << "[train]\ndata = \"synthetic\"\nlr = -1\nsteps = 1\n";
  CmdResult r = run("train --config " + cfg.string() + " --dry-run");
  expect_error(r, r.code == 2 ? 2 : 1, "--lr");
  EXPECT_NE(r.out.find("--lr was set in config file " + cfg.string()), std::string::npos) << r.out;
  // Typed on the command line, the same value is the user's own: no file is named.
  CmdResult typed = run("train --data synthetic --lr -1 --steps 1 --dry-run");
  EXPECT_EQ(typed.out.find("config file"), std::string::npos) << typed.out;
}

TEST(Cli, ConfigFileCommentsAndAHashInsideQuotes) {
  fs::path dir = fs::temp_directory_path() / "spotrain_cli_hash";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const fs::path run_dir = dir / "run#2";
  std::ofstream(dir / "c.toml") << "# a comment line\n; another\nmodel = \"resnet20\"  # inline\n"
                                   "data = 'synthetic' # single quotes\ntrain-limit = 64\nsteps = 1\n"
                                   "batch-size = 16\nckpt-dir = \"" << run_dir.string() << "\" # where\n";
  CmdResult r = run("train --config " + (dir / "c.toml").string());
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(fs::exists(run_dir / "ckpt-00000001.h5")) << r.out;
  fs::remove_all(dir);
}

// ---- one CUDA build for every machine -----------------------------------------------------------

#ifdef SPOTRAIN_WITH_CUDA
// The binary names no CUDA library among the ones it needs to start: cudart is linked
// statically (it opens the driver when first used); cuDNN, cuBLAS and NCCL are opened with
// dlopen when a GPU run needs them.
TEST(CudaBuild, NeedsNoCudaLibraryToStart) {
  CommandResult r = run_command(std::string("ldd ") + SPOTRAIN_BIN);
  ASSERT_EQ(r.code, 0) << r.out;
  for (const char* lib : {"libcudart", "libcudnn", "libcublas", "libnccl", "libcuda.so"})
    EXPECT_EQ(r.out.find(lib), std::string::npos) << lib << " is linked:\n" << r.out;
}

// With the CUDA toolkit's folder hidden (an empty tmpfs over /usr/local/cuda in a private mount
// namespace), the CUDA build still reports its versions and trains on the CPU.
TEST(CudaBuild, TrainsOnTheCpuWithTheCudaLibrariesUnavailable) {
  if (run_command("unshare --mount --propagation private true").code != 0)
    GTEST_SKIP() << "cannot make a mount namespace here (unshare needs root)";
  auto hidden = [](const std::string& args) {
    return run_command(
        "unshare --mount --propagation private sh -c 'mount -t tmpfs none /usr/local/cuda && "
        "test ! -e /usr/local/cuda/lib64 && exec " +
        std::string(SPOTRAIN_BIN) + " " + args + "'");
  };
  CommandResult v = hidden("--version");
  EXPECT_EQ(v.code, 0) << v.out;
  EXPECT_NE(v.out.find("cuDNN"), std::string::npos) << v.out;
  fs::path dir = fs::temp_directory_path() / "spotrain_cuda_hidden";
  fs::remove_all(dir);
  CommandResult t = hidden("train --model resnet20 --data synthetic --steps 2 --batch-size 4 "
                           "--device auto --threads 1 --ckpt-dir " + dir.string());
  EXPECT_EQ(t.code, 0) << t.out;
  EXPECT_NE(t.out.find("finished 2 steps"), std::string::npos) << t.out;
  fs::remove_all(dir);
}
#endif
