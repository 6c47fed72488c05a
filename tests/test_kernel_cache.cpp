// The kernel cache (kernels/kernel_cache.h): timed choices survive a restart on the same
// device only, two writers of one file keep each other's choices, a broken or foreign file
// costs a warning and is rewritten, and a folder that cannot be written never fails the run.
// The GPU backend fills it; everything here is device-neutral and runs on the CPU.
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "kernels/kernel_cache.h"

namespace fs = std::filesystem;
using spotrain::TuneVerdict;
using spotrain::KernelCache;

namespace {

class KernelCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("spotrain_tuning_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    ::chmod(dir_.c_str(), 0755);
    fs::remove_all(dir_);
  }
  std::string file() const { return (dir_ / "sub" / "kernel-cache.json").string(); }
  static std::string read(const std::string& p) {
    std::ifstream in(p);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }
  fs::path dir_;
};

const char* kH200 = "NVIDIA H200 sm_90, driver 580.1, cuDNN 91300, cuBLAS 130000";
const char* kA100 = "NVIDIA A100 sm_80, driver 580.1, cuDNN 91300, cuBLAS 130000";

TEST_F(KernelCacheTest, AChoiceSavedIsFoundByTheNextRunOnTheSameDeviceOnly) {
  {
    KernelCache c(file(), kH200);
    EXPECT_EQ(c.loaded(), 0u);
    EXPECT_EQ(c.find("conv fwd a"), nullptr);
    c.put("conv fwd a", TuneVerdict{"algo 1 math 1", 0.25, "algo 0 math 1", 0.31});
    c.put("graph b", TuneVerdict{"fp32 intermediates, candidate 2, engine 7", 1.5, "", 0});
    ASSERT_NE(c.find("conv fwd a"), nullptr);  // at once, before any save
    EXPECT_EQ(c.unsaved(), 2u);
    EXPECT_TRUE(c.save());  // the folder is made
    EXPECT_EQ(c.unsaved(), 0u);
    EXPECT_FALSE(c.save());  // nothing new: nothing written
  }
  KernelCache again(file(), kH200);
  EXPECT_EQ(again.loaded(), 2u);
  const TuneVerdict* v = again.find("conv fwd a");
  ASSERT_NE(v, nullptr);
  EXPECT_EQ(v->choice, "algo 1 math 1");
  EXPECT_DOUBLE_EQ(v->ms, 0.25);
  EXPECT_EQ(v->runner_up, "algo 0 math 1");
  EXPECT_DOUBLE_EQ(v->runner_up_ms, 0.31);
  EXPECT_EQ(v->times(), "0.250 ms, runner-up algo 0 math 1 0.310 ms");  // --profile's words
  ASSERT_NE(again.find("graph b"), nullptr);
  EXPECT_EQ(again.find("graph b")->runner_up, "");
  // Another GPU (or driver, or cuDNN) times its own: nothing of the H200's applies.
  KernelCache other(file(), kA100);
  EXPECT_EQ(other.loaded(), 0u);
  EXPECT_EQ(other.find("conv fwd a"), nullptr);
}

TEST_F(KernelCacheTest, TwoWritersOfOneFileKeepEachOthersChoices) {
  KernelCache a(file(), kH200), b(file(), kH200), gpu2(file(), kA100);
  a.put("x", TuneVerdict{"algo 1 math 1", 1, "", 0});
  b.put("y", TuneVerdict{"algo 6 math 2", 2, "", 0});
  gpu2.put("x", TuneVerdict{"algo 0 math 1", 3, "", 0});
  ASSERT_TRUE(a.save());
  ASSERT_TRUE(b.save());  // read after a's write: a's choice stays
  ASSERT_TRUE(gpu2.save());
  KernelCache h200(file(), kH200), a100(file(), kA100);
  EXPECT_EQ(h200.loaded(), 2u);
  ASSERT_NE(h200.find("x"), nullptr);
  EXPECT_EQ(h200.find("x")->choice, "algo 1 math 1");
  ASSERT_NE(h200.find("y"), nullptr);
  ASSERT_NE(a100.find("x"), nullptr);
  EXPECT_EQ(a100.find("x")->choice, "algo 0 math 1");
}

TEST_F(KernelCacheTest, ABrokenOrForeignFileIsAWarningAndIsRewritten) {
  fs::create_directories(fs::path(file()).parent_path());
  for (const std::string junk : {"{ not json", "{\"format\": \"something else\", \"devices\": {}}", "[1, 2]"}) {
    std::ofstream(file()) << junk;
    KernelCache c(file(), kH200);
    EXPECT_EQ(c.loaded(), 0u) << junk;
    EXPECT_FALSE(c.load_problem().empty()) << junk;
    c.put("k", TuneVerdict{"algo 2 math 1", 1, "", 0});
    ASSERT_TRUE(c.save()) << junk;
    KernelCache back(file(), kH200);
    EXPECT_TRUE(back.load_problem().empty()) << read(file());
    EXPECT_EQ(back.loaded(), 1u) << read(file());
  }
}

TEST_F(KernelCacheTest, AFolderThatCannotBeWrittenNeverFailsTheRun) {
  if (::geteuid() == 0) {
    // root writes anywhere: a path under a regular file stands for an unwritable folder.
    std::ofstream(dir_ / "plain") << "x";
    KernelCache c((dir_ / "plain" / "kernel-cache.json").string(), kH200);
    c.put("k", TuneVerdict{"algo 2 math 1", 1, "", 0});
    EXPECT_FALSE(c.save());
    EXPECT_EQ(c.unsaved(), 0u);  // said once, not tried at every step
    return;
  }
  ::chmod(dir_.c_str(), 0555);
  KernelCache c((dir_ / "kernel-cache.json").string(), kH200);
  c.put("k", TuneVerdict{"algo 2 math 1", 1, "", 0});
  EXPECT_FALSE(c.save());
}

TEST_F(KernelCacheTest, InMemoryOnlyWithoutAPath) {
  KernelCache c("", kH200);
  c.put("k", TuneVerdict{"algo 2 math 1", 1, "", 0});
  EXPECT_NE(c.find("k"), nullptr);
  EXPECT_FALSE(c.save());
}

TEST_F(KernelCacheTest, TheSettingNamesTheFile) {
  EXPECT_EQ(KernelCache::resolve_path("none", "/runs/a"), "");
  EXPECT_EQ(KernelCache::resolve_path("/x/k.json", "/runs/a"), "/x/k.json");
  EXPECT_EQ(KernelCache::resolve_path("auto", "/runs/a"), "/runs/a/kernel-cache.json");
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  const std::string saved = xdg ? xdg : "";
  ::setenv("XDG_CACHE_HOME", "/cache", 1);
  EXPECT_EQ(KernelCache::resolve_path("auto", ""), "/cache/spotrain/kernel-cache.json");
  ::unsetenv("XDG_CACHE_HOME");
  const char* home = std::getenv("HOME");
  if (home && *home) {
    EXPECT_EQ(KernelCache::resolve_path("auto", ""), std::string(home) + "/.cache/spotrain/kernel-cache.json");
  }
  if (!saved.empty()) ::setenv("XDG_CACHE_HOME", saved.c_str(), 1);
}

}  // namespace
