// `spotrain doctor` as a user runs it: on this healthy CPU node it passes every check (ops
// against the float64 reference, the blocked fp32 path training takes among the targets, the
// GEMM rate, ResNet-50 training steps and the first-use checks they ran, the checkpoint
// folder) and exits 0; with a planted wrong op (SPOTRAIN_WRONG_OP: a convolution, or the 8-bit
// upload) or a full checkpoint disk (SPOTRAIN_FREE_BYTES) it exits 1 naming the cause; --json
// says the same.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "run_command.h"
#include "scratch_dir.h"

namespace {

const std::string kBin = SPOTRAIN_BIN;

// The lines of `out` whose verdict is `verdict` ("ok", "warn", "fail").
std::vector<std::string> lines_of(const std::string& out, const std::string& verdict) {
  std::vector<std::string> v;
  std::istringstream in(out);
  for (std::string l; std::getline(in, l);)
    if (l.rfind(verdict + " ", 0) == 0) v.push_back(l);
  return v;
}

bool has_line(const std::vector<std::string>& lines, const std::string& a, const std::string& b = "") {
  for (const std::string& l : lines)
    if (l.find(a) != std::string::npos && l.find(b) != std::string::npos) return true;
  return false;
}

// A quick doctor on the CPU (2 threads, fp32, one resnet20 step), `env` set before it and `more`
// options after; it prints what the doctor printed and returns it.
CommandResult quick_cpu_doctor(const std::string& env, const std::string& more = "") {
  CommandResult r = run_command(env + " " + kBin +
                                " doctor --device cpu --threads 2 --precision fp32 --model resnet20 --steps 1" + more);
  std::printf("%s", r.out.c_str());
  return r;
}

}  // namespace

// The whole default pass on the CPU (ResNet-50 steps included), with a checkpoint folder.
TEST(Doctor, AHealthyCpuNodePassesEveryCheck) {
  const auto dir = fresh_dir("spotrain_doctor_ok");
  const std::string json = (dir / "doctor.json").string();
  CommandResult r = run_command(kBin + " doctor --device cpu --threads 2 --ckpt-dir " +
                                (dir / "ckpt").string() + " --json " + json);
  std::printf("%s", r.out.c_str());
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(lines_of(r.out, "fail").empty());
  const auto ok = lines_of(r.out, "ok");
  for (const char* target : {"blocked_fp32", "blocked_bf16", "blocked_fp16", "nhwc_fp32", "nhwc_bf16", "nhwc_fp16"})
    EXPECT_TRUE(has_line(ok, std::string("ops cpu ") + target + ":", "against the float64 reference")) << target;
  EXPECT_TRUE(has_line(ok, "fast path 8-bit-upload", "first-use check passed"));
  EXPECT_TRUE(has_line(ok, "fast path captured-steps", "not used on cpu"));
  const auto all = [&] {
    auto v = ok;
    for (const auto& l : lines_of(r.out, "warn")) v.push_back(l);
    return v;
  }();
  EXPECT_TRUE(has_line(all, "cpu gemm fp32", "GFLOP/s"));
  EXPECT_TRUE(has_line(all, "steps resnet50 fp32", "images/s"));
  EXPECT_TRUE(has_line(all, "steps resnet50 fp32", "memory"));
  EXPECT_TRUE(has_line(all, "ckpt-dir space", "MiB free"));
  EXPECT_TRUE(has_line(all, "ckpt-dir write", "MiB/s"));
  EXPECT_NE(r.out.find("doctor: healthy"), std::string::npos);
  EXPECT_TRUE(temporaries_in(dir / "ckpt").empty()) << "the write test left its file";
  std::ifstream in(json);
  const nlohmann::json j = nlohmann::json::parse(in);
  EXPECT_TRUE(j.at("healthy").get<bool>());
  EXPECT_GE(j.at("checks").size(), 10u);
}

// A wrong kernel (its output doubled) fails the op checks that use it, each line naming the
// op, and the node is not healthy; the ops it does not touch still pass.
TEST(Doctor, APlantedWrongOpFailsNamingIt) {
  CommandResult r = quick_cpu_doctor("SPOTRAIN_WRONG_OP=conv2d_forward");
  EXPECT_EQ(r.code, 1) << r.out;
  const auto fail = lines_of(r.out, "fail");
  ASSERT_FALSE(fail.empty()) << r.out;
  EXPECT_TRUE(has_line(fail, "ops cpu blocked_fp32", "conv2d_forward")) << r.out;
  EXPECT_TRUE(has_line(fail, "ops cpu nhwc_fp32", "conv2d_forward")) << r.out;
  EXPECT_NE(r.out.find("doctor: NOT healthy"), std::string::npos);
  CommandResult control = quick_cpu_doctor("");
  EXPECT_EQ(control.code, 0) << control.out;
}

// A wrong 8-bit upload fails the op suite's upload_pixels check and, in the training steps,
// the 8-bit upload's first-use check, whose verdict the doctor prints.
TEST(Doctor, AWrongEightBitUploadFailsItsOpAndItsFirstUseCheck) {
  CommandResult r = quick_cpu_doctor("SPOTRAIN_WRONG_OP=upload_pixels");
  EXPECT_EQ(r.code, 1) << r.out;
  const auto fail = lines_of(r.out, "fail");
  EXPECT_TRUE(has_line(fail, "ops cpu blocked_fp32", "upload_pixels")) << r.out;
  EXPECT_TRUE(has_line(fail, "fast path 8-bit-upload", "first-use check failed")) << r.out;
  EXPECT_FALSE(has_line(fail, "conv2d_forward")) << "only the planted op fails: " << r.out;
}

// A checkpoint folder without room for --keep checkpoints fails the space check, naming the
// folder, what is free and what is needed.
TEST(Doctor, AFullCheckpointDiskFailsNamingIt) {
  const auto dir = fresh_dir("spotrain_doctor_full");
  const std::string json = (dir / "doctor.json").string();
  CommandResult r = quick_cpu_doctor("SPOTRAIN_FREE_BYTES=1048576",
                                     " --keep 3 --ckpt-dir " + (dir / "ckpt").string() + " --json " + json);
  EXPECT_EQ(r.code, 1) << r.out;
  const auto fail = lines_of(r.out, "fail");
  EXPECT_TRUE(has_line(fail, "ckpt-dir space", "1.0 MiB free")) << r.out;
  EXPECT_TRUE(has_line(fail, "ckpt-dir space", "--keep 3")) << r.out;
  std::ifstream in(json);
  const nlohmann::json j = nlohmann::json::parse(in);
  EXPECT_FALSE(j.at("healthy").get<bool>());
}

TEST(Doctor, BadOptionsAreOneErrorLine) {
  CommandResult r = run_command(kBin + " doctor --device tpu");
  EXPECT_EQ(r.code, 2) << r.out;
  r = run_command(kBin + " doctor --device cpu --steps 0");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("error: --steps"), std::string::npos) << r.out;
}
