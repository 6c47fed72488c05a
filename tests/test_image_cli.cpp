// The ImageNet-class pipeline end to end through the CLI, on a real JPEG ImageFolder made
// from Fashion-MNIST (some grayscale, one CMYK, one corrupt, one truncated): training reports
// the bad files, eval gives top-1/top-5, shards train exactly as the folder does.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "image_folder_fixture.h"
#include "run_command.h"

namespace fs = std::filesystem;

namespace {

std::string tmp(const std::string& tag) {
  return (fs::temp_directory_path() / ("spotrain_imgcli_" + tag + "_" + std::to_string(getpid()))).string();
}

CommandResult run(const std::string& args) { return run_command(std::string(SPOTRAIN_BIN) + " " + args); }

// The text after the last `key` up to the next space or '%'.
std::string last_value(const std::string& out, const std::string& key) {
  size_t p = out.rfind(key);
  if (p == std::string::npos) return "";
  std::string v = out.substr(p + key.size());
  return v.substr(0, v.find_first_of(" %\n"));
}

class ImageCli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { fx_ = make_fashion_image_folder(tmp("folder"), 24, 6); }
  static void TearDownTestSuite() { fs::remove_all(fx_.root); }
  static ImageFolderFixture fx_;
  // Small and quick: 24x24 crops of the 28x28 images, the CIFAR-style ResNet-20.
  static std::string train_args(const std::string& data, const std::string& ckpt) {
    return "train --data " + data + " --model resnet20 --image-size 24 --batch-size 20 --epochs 2 --lr 0.05 "
           "--threads 2 --workers 2 --deterministic --log-every 6 --ckpt-dir '" + ckpt + "'";
  }
};
ImageFolderFixture ImageCli::fx_;

TEST_F(ImageCli, TrainReportsBadImagesAndEvalGivesTopK) {
  const std::string ck = tmp("ckpt");
  fs::remove_all(ck);
  const std::string metrics = ck + ".jsonl";
  CommandResult r = run(train_args("imagefolder:" + fx_.root, ck) +
                        " --max-bad-fraction 0.01 --eval-every 1 --metrics " + metrics);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find(fx_.corrupt), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(fx_.truncated), std::string::npos) << r.out;
  // One line at the end, with the count and the first image (each was named as it was met).
  EXPECT_NE(r.out.find("skipped 2 unreadable training image(s); the first: "), std::string::npos) << r.out;
  // Evaluated after each epoch.
  std::ifstream mf(metrics);
  std::string line;
  int evals = 0;
  while (std::getline(mf, line)) evals += line.find("\"test_top5\"") != std::string::npos;
  EXPECT_EQ(evals, 2);
  // The class index next to the checkpoints: sorted class directory names.
  std::ifstream cf(ck + "/classes.txt");
  std::vector<std::string> classes;
  while (std::getline(cf, line)) classes.push_back(line);
  ASSERT_EQ(classes.size(), 10u);
  EXPECT_TRUE(std::is_sorted(classes.begin(), classes.end()));
  EXPECT_TRUE(fs::is_directory(fx_.root + "/train/" + classes[3]));
  // `eval` on the val split reproduces the trainer's final figures.
  const std::string top1 = last_value(r.out, "test top-1 "), top5 = last_value(r.out, "top-5 ");
  ASSERT_FALSE(top1.empty()) << r.out;
  CommandResult e = run("eval --ckpt " + ck + " --data imagefolder:" + fx_.root + " --workers 2");
  ASSERT_EQ(e.code, 0) << e.out;
  EXPECT_EQ(last_value(e.out, "top-1 "), top1) << e.out;
  EXPECT_EQ(last_value(e.out, "top-5 "), top5) << e.out;
  EXPECT_NE(e.out.find("on 60 images"), std::string::npos) << e.out;
  // Two epochs on 480 images learn something: at least twice chance (10%), 12 of the 60.
  EXPECT_GE(std::stod(top1), 20.0) << r.out;
  fs::remove_all(ck);
  fs::remove(metrics);
}

TEST_F(ImageCli, TooManyBadImagesStopWithOneClearError) {
  CommandResult r = run(train_args("imagefolder:" + fx_.root, "") + " --steps 30");  // default 0.1%
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("error: "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("--max-bad-fraction"), std::string::npos) << r.out;
}

TEST_F(ImageCli, PackVerifyAndShardsTrainLikeTheFolder) {
  const std::string sh = tmp("shards");
  fs::remove_all(sh);
  CommandResult p = run("data pack " + fx_.root + " " + sh + " --shard-size 8KiB");
  ASSERT_EQ(p.code, 0) << p.out;
  EXPECT_TRUE(fs::exists(sh + "/train/index.bin"));
  EXPECT_TRUE(fs::exists(sh + "/val/shard-00000.bin"));
  CommandResult v = run("data verify " + sh);
  EXPECT_EQ(v.code, 0) << v.out;
  EXPECT_NE(v.out.find("OK"), std::string::npos) << v.out;
  // Same pixels, same model: the same losses and accuracy, step for step.
  const std::string a = tmp("ck_a"), b = tmp("ck_b");
  CommandResult rf = run(train_args("imagefolder:" + fx_.root, a) + " --max-bad-fraction 0.01 --steps 12");
  CommandResult rs = run(train_args("shards:" + sh, b) + " --max-bad-fraction 0.01 --steps 12");
  ASSERT_EQ(rf.code, 0) << rf.out;
  ASSERT_EQ(rs.code, 0) << rs.out;
  EXPECT_EQ(last_value(rf.out, " loss "), last_value(rs.out, " loss "));
  EXPECT_EQ(last_value(rf.out, "test top-1 "), last_value(rs.out, "test top-1 "));
  EXPECT_FALSE(last_value(rs.out, " loss ").empty()) << rs.out;
  // A damaged shard fails verify with a non-zero exit.
  fs::resize_file(sh + "/train/shard-00001.bin", 64);
  CommandResult bad = run("data verify " + sh);
  EXPECT_EQ(bad.code, 1) << bad.out;
  EXPECT_NE(bad.out.find("error: "), std::string::npos) << bad.out;
  fs::remove_all(sh);
  fs::remove_all(a);
  fs::remove_all(b);
}

TEST_F(ImageCli, BenchOnRealDataReportsDataWaitAndJson) {
  const std::string js = tmp("bench") + ".json";
  CommandResult r = run("bench --model resnet20 --image-size 24 --batch-size 20 --steps 3 --warmup 1 --threads 2 "
                        "--data imagefolder:" + fx_.root + " --workers 1 --max-bad-fraction 0.01 --price-per-hour 2.5 --json " + js);
  ASSERT_EQ(r.code, 0) << r.out;
  std::ifstream f(js);
  std::string j((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  for (const char* key : {"\"images_per_sec\"", "\"images_per_sec_p10\"", "\"images_per_sec_per_rank\"",
                          "\"data\"", "\"comm_exposed\"", "\"peak_memory_bytes\"", "\"gpu\"",
                          "\"imagenet_90_epochs\"", "\"input_bound\""})
    EXPECT_NE(j.find(key), std::string::npos) << key << " missing in " << j;
  EXPECT_NE(r.out.find("images/s per rank"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("90-epoch ImageNet"), std::string::npos) << r.out;
  // The input-bound advice appears exactly when the JSON says so.
  const bool bound = j.find("\"input_bound\": true") != std::string::npos;
  EXPECT_EQ(bound, r.out.find("input-bound:") != std::string::npos) << r.out;
  fs::remove(js);
}

}  // namespace
