// The JPEG ImageFolder pipeline under mpirun (2 ranks): training runs, each rank reports the
// bad files it met, and the validation set split across ranks gives exactly the top-1 /
// top-5 a single-process `spotrain eval` of the saved checkpoint gives.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "image_folder_fixture.h"
#include "run_command.h"

namespace fs = std::filesystem;

namespace {

std::string last_value(const std::string& out, const std::string& key) {
  size_t p = out.rfind(key);
  if (p == std::string::npos) return "";
  std::string v = out.substr(p + key.size());
  return v.substr(0, v.find_first_of(" %\n"));
}

TEST(ImageMpi, TwoRanksTrainAndEvaluateTheWholeValSplit) {
  setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 0);
  setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 0);
  const std::string base = (fs::temp_directory_path() / ("spotrain_imgmpi_" + std::to_string(getpid()))).string();
  ImageFolderFixture fx = make_fashion_image_folder(base + "_folder", 16, 5);
  const std::string ck = base + "_ckpt";
  fs::remove_all(ck);
  CommandResult r = run_command(
      "timeout -k 10 120 " + std::string(MPIEXEC_EXECUTABLE) +
      " -np 2 --oversubscribe --bind-to none -x OMP_NUM_THREADS=1 " + SPOTRAIN_BIN +
      " train --data imagefolder:" + fx.root + " --model resnet20 --image-size 24 --batch-size 10 --epochs 1"
      " --threads 1 --workers 1 --max-bad-fraction 0.02 --log-every 4 --ckpt-dir " + ck);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("(50 images)"), std::string::npos) << r.out;  // the whole val split
  EXPECT_NE(r.out.find("zz_corrupt.JPEG"), std::string::npos) << r.out;
  const std::string top1 = last_value(r.out, "test top-1 "), top5 = last_value(r.out, "top-5 ");
  ASSERT_FALSE(top1.empty()) << r.out;
  CommandResult e = run_command(std::string(SPOTRAIN_BIN) + " eval --ckpt " + ck + " --data imagefolder:" +
                                fx.root + " --threads 1");
  ASSERT_EQ(e.code, 0) << e.out;
  EXPECT_EQ(last_value(e.out, "top-1 "), top1) << e.out << "\nvs training:\n" << r.out;
  EXPECT_EQ(last_value(e.out, "top-5 "), top5) << e.out;
  fs::remove_all(ck);
  fs::remove_all(fx.root);
}

}  // namespace
