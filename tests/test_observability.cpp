// Seeing a run: telemetry in the metrics (the GPU field null without a GPU, host fields always),
// the input-bound warning (a starved loader gets it, synthetic data does not), the Prometheus
// text file (parsed by a small exposition-format parser, replaced atomically while a reader
// reads it), `eval --json`, the CSV export, and `spotrain report` rendered in headless
// Chromium (charts drawn with their series and markers, no network request).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "comm/communicator.h"
#include "core/clock.h"
#include "engine/loss_scaler.h"
#include "observe/input_watch.h"
#include "observe/rank_watch.h"
#include "observe/progress.h"
#include "run/stop_policy.h"
#include "observe/prometheus.h"
#include "observe/telemetry.h"
#include "io/jpeg.h"
#include "io/png.h"
#include "headless_page.h"
#include "run_command.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

const std::string kBin = SPOTRAIN_BIN;

std::string fresh_dir(const std::string& name) {
  const std::string d = (fs::temp_directory_path() / ("spotrain_obs_" + name)).string();
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::vector<json> records(const std::string& metrics, const std::string& type = "") {
  std::vector<json> out;
  std::ifstream in(metrics);
  for (std::string line; std::getline(in, line);) {
    json j = json::parse(line);
    if (type.empty() || j["type"] == type) out.push_back(j);
  }
  return out;
}

// One compute thread: these runs check what is recorded and drawn, not speed, and each keeps to
// the one core ctest gives it (two OpenMP threads beside another test wait on each other at every
// op: the report's run took 77-116 s under ctest -j2 that way, 2-3 s alone).
std::string train_cmd(const std::string& dir, const std::string& extra) {
  return kBin + " train --data synthetic --model resnet20 --image-size 32 --batch-size 8 --threads 1 "
                "--ckpt-dir " + dir + " " + extra;
}

// Prometheus text exposition format (0.0.4): "# HELP name text", "# TYPE name type", and
// samples "name{label="value",...} number". Returns name{labels} -> value; fails the test on a
// line that does not parse or a sample whose family has no TYPE line.
std::map<std::string, double> parse_prometheus(const std::string& text) {
  static const std::regex help(R"(^# HELP ([a-zA-Z_:][a-zA-Z0-9_:]*) .+$)");
  static const std::regex type(R"(^# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) (gauge|counter|untyped|summary|histogram)$)");
  static const std::regex sample(
      R"(^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([a-zA-Z_][a-zA-Z0-9_]*="(\\.|[^"\\])*"(,[a-zA-Z_][a-zA-Z0-9_]*="(\\.|[^"\\])*")*)?\})? ([-+]?([0-9]*\.?[0-9]+([eE][-+]?[0-9]+)?|NaN|Inf))$)");
  std::map<std::string, double> out;
  std::map<std::string, std::string> types;
  EXPECT_FALSE(text.empty());
  EXPECT_EQ(text.back(), '\n') << "the file must end with a newline";
  std::istringstream in(text);
  std::smatch m;
  for (std::string line; std::getline(in, line);) {
    if (std::regex_match(line, m, type)) {
      EXPECT_EQ(types.count(m[1]), 0u) << "a second TYPE line for " << m[1];
      types[m[1]] = m[2];
    } else if (std::regex_match(line, m, help)) {
    } else if (std::regex_match(line, m, sample)) {
      EXPECT_EQ(types.count(m[1]), 1u) << "sample without a TYPE line: " << line;
      out[std::string(m[1]) + std::string(m[2])] = std::stod(m[7]);
    } else {
      ADD_FAILURE() << "not in the text exposition format: '" << line << "'";
    }
  }
  return out;
}

double value_of(const std::map<std::string, double>& samples, const std::string& name) {
  for (auto& [k, v] : samples)
    if (k == name || k.rfind(name + "{", 0) == 0) return v;
  return NAN;
}

}  // namespace

TEST(Telemetry, WithoutAGpuTheGpuFieldIsNullAndTheHostIsMeasured) {
  spotrain::Telemetry none("");
  json s = none.sample();
  EXPECT_TRUE(s["gpu"].is_null()) << s.dump();
  EXPECT_FALSE(none.sm_util().has_value());
  ASSERT_TRUE(s["host"].is_object());
  EXPECT_GT(s["host"]["rss_bytes"].get<double>(), 1e6);
  EXPECT_GE(s["host"]["cores"].get<int>(), 1);
  // A GPU that NVML does not know (or no NVML at all): still null, never an error.
  spotrain::Telemetry bogus("0000:ff:1f.7");
  EXPECT_TRUE(bogus.sample()["gpu"].is_null());
  EXPECT_FALSE(bogus.gpu_status().empty());
}

TEST(Telemetry, ACpuRunRecordsItWithEveryProgressLineAndTrainsAsUsual) {
  const std::string dir = fresh_dir("telemetry");
  auto r = run_command(train_cmd(dir, "--steps 12 --log-every 4 --train-limit 256 --test-limit 64 --device cpu"));
  ASSERT_EQ(r.code, 0) << r.out;
  auto steps = records(dir + "/metrics.jsonl", "step");
  ASSERT_EQ(steps.size(), 3u);
  for (const json& s : steps) {
    EXPECT_TRUE(s["gpu"].is_null()) << s.dump();
    EXPECT_GT(s["host"]["rss_bytes"].get<double>(), 1e6);
    const double share = s["data_wait_share"].get<double>();
    EXPECT_GE(share, 0.0);
    EXPECT_LE(share, 1.0);
    EXPECT_GT(s["step_seconds"].get<double>(), 0.0);
    EXPECT_GT(s["memory_bytes"].get<double>(), 0.0);
    for (const char* phase : {"data", "forward", "backward", "comm_exposed", "optimizer"})
      EXPECT_TRUE(s["phases"].contains(phase)) << phase;
    EXPECT_GT(s["phases"]["forward"].get<double>(), 0.0);
  }
  // The progress line carries the time, the step time, the data-wait share and memory.
  EXPECT_TRUE(std::regex_search(r.out, std::regex(R"(\d\d:\d\d:\d\d epoch 1/1 step 4/12 .* s/step, data [0-9.]+%, [0-9.]+ img/s, mem [0-9.]+ GiB)")))
      << r.out;
  // bench records the same telemetry.
  auto b = run_command(kBin + " bench --model resnet20 --image-size 32 --batch-size 8 --steps 2 --warmup 1 "
                              "--threads 1 --device cpu --json " + dir + "/bench.json");
  ASSERT_EQ(b.code, 0) << b.out;
  json bj = json::parse(read_file(dir + "/bench.json"));
  EXPECT_TRUE(bj["telemetry"]["gpu"].is_null()) << bj.dump();
  EXPECT_GT(bj["telemetry"]["host"]["rss_bytes"].get<double>(), 1e6);
}

// A step whose loss is not finite (an fp16 step skipped for an overflow in its forward) counts
// in the images trained on, not in the loss and accuracy it would make NaN and 100%.
TEST(ProgressTally, AStepWithANonFiniteLossCountsInImagesOnly) {
  spotrain::Tally t;
  t.add(spotrain::LossResult{2.0, 3, 5}, 8);
  t.add(spotrain::LossResult{std::nan(""), 8, 8}, 8);
  t.add(spotrain::LossResult{1.0, 1, 2}, 8);
  EXPECT_EQ(t.images, 24);
  EXPECT_EQ(t.n, 16);
  EXPECT_DOUBLE_EQ(t.mean_loss(), 1.5);
  EXPECT_DOUBLE_EQ(t.accuracy(), 4.0 / 16.0);
  spotrain::Tally skipped_only;
  skipped_only.add(spotrain::LossResult{std::nan(""), 0, 0}, 8);
  EXPECT_TRUE(std::isnan(skipped_only.mean_loss())) << "no finite step: the loss is unknown";
  EXPECT_EQ(skipped_only.accuracy(), 0.0);
  EXPECT_EQ(spotrain::Tally{}.mean_loss(), 0.0);
}

// Estimates come from steady-state steps: after a first step of 10 s (start-up) and steps of
// 1 s, the ETA is 1 s per step left, not the time since start over the steps done; before
// three steady steps there is none, and the record says null. The first step of an epoch
// (the loader's restart, the evaluation before it) is left out too.
TEST(ProgressEstimates, TheEtaComesFromSteadyStepsNotFromTheFirst) {
  auto comm = spotrain::make_communicator("local");
  spotrain::CommWorker worker(*comm, 60);
  const std::string d = fresh_dir("eta");
  spotrain::MetricsSink metrics(d + "/metrics.jsonl", true);
  spotrain::LossScaler scaler{spotrain::LossScalerOptions{}};
  spotrain::Telemetry telemetry("");
  spotrain::Progress p(worker, metrics, nullptr, scaler, spotrain::Allocator::host(), telemetry,
                       /*log_every=*/1, /*workers=*/1, /*epochs=*/2, /*total_steps=*/100,
                       /*first_step=*/0);
  double t = spotrain::now_seconds();
  auto step = [&](int64_t s, int64_t epoch, double seconds) {
    t += seconds;
    spotrain::StepFacts f;
    f.step = s;
    f.epoch = epoch;
    f.batch = 8;
    f.loss = spotrain::LossResult{2.0, 1, 4};
    f.done_at = t;
    p.step(f);
  };
  p.start_epoch();
  step(1, 0, 10.0);
  for (int64_t s = 2; s <= 8; ++s) step(s, 0, 1.0);
  EXPECT_DOUBLE_EQ(p.steady_step_seconds(), 1.0);
  p.start_epoch();
  step(9, 1, 30.0);  // after an evaluation
  step(10, 1, 1.0);
  EXPECT_DOUBLE_EQ(p.steady_step_seconds(), 1.0);
  std::vector<json> steps = records(d + "/metrics.jsonl", "step");
  ASSERT_EQ(steps.size(), 10u);
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(steps[i]["eta_seconds"].is_null()) << steps[i].dump();
  EXPECT_DOUBLE_EQ(steps[7]["eta_seconds"].get<double>(), 92.0) << steps[7].dump();
  EXPECT_DOUBLE_EQ(steps[8]["eta_seconds"].get<double>(), 91.0) << steps[8].dump();
  EXPECT_DOUBLE_EQ(steps[9]["eta_seconds"].get<double>(), 90.0) << steps[9].dump();
}

// What a stop takes is said once the steps are steady, from their median: a step after an
// evaluation (3.8 s where steps take 0.2 s) does not make it.
TEST(ProgressEstimates, AStopsCostIsSaidFromSteadySteps) {
  spotrain::StopPolicy stop("", spotrain::now_seconds(), nullptr, nullptr);
  testing::internal::CaptureStdout();
  stop.after_step(/*latest=*/3.8, /*steady=*/0.0, /*checkpoint=*/2.0);
  const std::string warming = testing::internal::GetCapturedStdout();
  EXPECT_EQ(warming.find("a stop takes"), std::string::npos) << warming;
  testing::internal::CaptureStdout();
  stop.after_step(/*latest=*/3.8, /*steady=*/0.2, /*checkpoint=*/2.0);
  const std::string said = testing::internal::GetCapturedStdout();
  EXPECT_NE(said.find("a stop takes about 2.2 s (the step under way 0.2 s"), std::string::npos) << said;
}

TEST(InputWatch, WarnsOnceWhenDataWaitExceedsTenPercentOverTwentySteps) {
  spotrain::InputWatch w(3);
  EXPECT_EQ(w.add(1, 10, 0.5, 1.0, std::nullopt), "");  // 50%, but only 10 steps so far
  const std::string warning = w.add(11, 20, 0.5, 1.0, std::nullopt);
  EXPECT_NE(warning.find("input-bound"), std::string::npos);
  EXPECT_NE(warning.find("--workers, now 3"), std::string::npos);
  EXPECT_NEAR(w.share(), 0.5, 1e-12);
  EXPECT_EQ(w.from_step(), 1);
  EXPECT_EQ(w.add(21, 40, 1.9, 2.0, std::nullopt), "") << "said once";

  spotrain::InputWatch busy(1);
  EXPECT_EQ(busy.add(1, 20, 0.09, 1.0, std::nullopt), "");  // 9%: fine
  EXPECT_EQ(busy.add(21, 40, 0.06, 1.0, 95.0), "");         // 6% with a busy GPU: fine
  EXPECT_NE(busy.add(41, 60, 0.06, 1.0, 40.0), "");         // 6% with an idle GPU: input-bound
}

TEST(InputBound, AStarvedLoaderIsCalledOutAndSyntheticDataIsNot) {
  // Large noisy JPEGs (expensive to decode) cut to 32x32, one loader thread; one compute
  // thread, so a busy machine (ctest -j) slows the step less than the decode.
  const std::string dir = fresh_dir("starved"), data = dir + "/images";
  std::mt19937 rng(7);
  const int side = 1024;
  std::vector<uint8_t> px(size_t(side) * side * 3);
  for (auto& p : px) p = uint8_t(rng());
  for (const char* split : {"train", "val"})
    for (int c = 0; c < 2; ++c) {
      const std::string d = data + "/" + split + "/class" + std::to_string(c);
      fs::create_directories(d);
      for (int i = 0; i < (std::string(split) == "train" ? 40 : 2); ++i) {
        px[size_t(i)] ^= 0xff;  // every file different
        auto jpg = spotrain::io::encode_jpeg(px.data(), side, side, 3, 95);
        std::ofstream(d + "/img" + std::to_string(i) + ".jpg", std::ios::binary)
            .write(reinterpret_cast<const char*>(jpg.data()), std::streamsize(jpg.size()));
      }
    }
  auto r = run_command(kBin + " train --data imagefolder:" + data + " --model resnet20 --image-size 32 "
                       "--batch-size 4 --threads 1 --workers 1 --prefetch 1 --steps 30 --log-every 5 "
                       "--ckpt-dir " + dir + "/run");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("warning: input-bound: steps"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("input-bound", r.out.find("input-bound") + 1), std::string::npos) << "said once:\n" << r.out;
  auto w = records(dir + "/run/metrics.jsonl", "warning");
  ASSERT_EQ(w.size(), 1u);
  EXPECT_EQ(w[0]["kind"], "input_bound");
  EXPECT_GT(w[0]["data_wait_share"].get<double>(), 0.10);

  const std::string syn = fresh_dir("synthetic");
  auto s = run_command(train_cmd(syn, "--steps 40 --log-every 5 --train-limit 512 --test-limit 64"));
  ASSERT_EQ(s.code, 0) << s.out;
  EXPECT_EQ(s.out.find("input-bound"), std::string::npos) << s.out;
  EXPECT_TRUE(records(syn + "/metrics.jsonl", "warning").empty());
}

TEST(Prometheus, TheFileIsReplacedWholeAndParses) {
  const std::string dir = fresh_dir("prom_unit"), path = dir + "/job.prom";
  spotrain::PrometheusFile f(path, "run=\"a \\\"quoted\\\" run\",rank=\"0\"");
  json rec = {{"step", 7}, {"loss", 1.5}, {"images_per_sec", 100.0}, {"data_wait_share", 0.25},
              {"gpu", {{"sm_util", 80}, {"memory_used_bytes", 1e9}}}, {"host", {{"rss_bytes", 2e6}}}};
  auto samples = spotrain::prom_samples_of_record(rec);
  f.write(samples);
  struct stat a {};
  ASSERT_EQ(stat(path.c_str(), &a), 0);
  auto parsed = parse_prometheus(read_file(path));
  EXPECT_EQ(value_of(parsed, "spotrain_step"), 7);
  EXPECT_EQ(value_of(parsed, "spotrain_data_wait_ratio"), 0.25);
  EXPECT_EQ(value_of(parsed, "spotrain_gpu_sm_utilization_ratio"), 0.8);
  EXPECT_EQ(value_of(parsed, "spotrain_process_resident_bytes"), 2e6);
  rec["step"] = 8;
  f.write(spotrain::prom_samples_of_record(rec));
  struct stat b {};
  ASSERT_EQ(stat(path.c_str(), &b), 0);
  EXPECT_NE(a.st_ino, b.st_ino) << "replaced by a rename, not rewritten in place";
  EXPECT_EQ(value_of(parse_prometheus(read_file(path)), "spotrain_step"), 8);
  for (auto& e : fs::directory_iterator(dir))
    EXPECT_NE(e.path().extension(), ".tmp") << "a temporary left behind: " << e.path();
  // The GPU's series carry DCGM exporter's labels (to join on); the others do not.
  json on_gpu = rec;  // step 8 by now
  on_gpu["gpu"]["index"] = 3;
  on_gpu["gpu"]["uuid"] = "GPU-5f1c";
  on_gpu["gpu"]["pci_bus_id"] = "00000000:19:00.0";
  f.write(spotrain::prom_samples_of_record(on_gpu));
  const std::string text = read_file(path);
  EXPECT_NE(text.find("spotrain_gpu_sm_utilization_ratio{run=\"a \\\"quoted\\\" run\",rank=\"0\",gpu=\"3\","
                      "UUID=\"GPU-5f1c\",pci_bus_id=\"00000000:19:00.0\"} 0.8"), std::string::npos) << text;
  EXPECT_NE(text.find("spotrain_step{run=\"a \\\"quoted\\\" run\",rank=\"0\"} 8"), std::string::npos) << text;
  // A folder that cannot be written: one clear error.
  spotrain::PrometheusFile bad(dir + "/no/such/folder/x.prom", "");
  EXPECT_THROW(bad.write(samples), std::exception);
}

TEST(Prometheus, ATrainingRunKeepsAWholeFileForAReaderAtEveryMoment) {
  const std::string dir = fresh_dir("prom_run"), prom = dir + "/textfile/spotrain.prom";
  fs::create_directories(dir + "/textfile");
  std::atomic<bool> done{false};
  std::atomic<int> reads{0}, bad{0};
  std::thread reader([&] {
    while (!done) {
      std::string t = read_file(prom);
      if (t.empty()) continue;  // not written yet
      ++reads;
      // Whole: ends with the last sample's newline and holds the last family.
      if (t.back() != '\n' || t.find("spotrain_last_update_timestamp_seconds{") == std::string::npos) ++bad;
    }
  });
  auto r = run_command(train_cmd(dir + "/run", "--steps 40 --log-every 1 --train-limit 512 --test-limit 64 "
                                               "--ckpt-every 10 --prometheus " + prom));
  done = true;
  reader.join();
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_GT(reads.load(), 10);
  EXPECT_EQ(bad.load(), 0) << "a reader saw a partial file";
  auto s = parse_prometheus(read_file(prom));
  EXPECT_EQ(value_of(s, "spotrain_step"), 40);
  EXPECT_EQ(value_of(s, "spotrain_running"), 0) << "the run has ended";
  EXPECT_EQ(value_of(s, "spotrain_restarts_total"), 0);
  EXPECT_NE(read_file(prom).find("# TYPE spotrain_restarts_total counter"), std::string::npos) << read_file(prom);
  EXPECT_GE(value_of(s, "spotrain_last_checkpoint_age_seconds"), 0);
  EXPECT_GT(value_of(s, "spotrain_last_checkpoint_timestamp_seconds"), 1.7e9);
  EXPECT_GT(value_of(s, "spotrain_images_per_second"), 0);
  EXPECT_NE(s.count("spotrain_step{run=\"run\",rank=\"0\"}"), 0u) << "labelled with the run folder";
  EXPECT_TRUE(std::isnan(value_of(s, "spotrain_gpu_sm_utilization_ratio"))) << "no GPU: no GPU samples";
  // Not a .prom name: the collector would never read it.
  auto bad_name = run_command(train_cmd(dir + "/run2", "--steps 1 --prometheus " + dir + "/x.txt"));
  EXPECT_EQ(bad_name.code, 1);
  EXPECT_NE(bad_name.out.find("must end in .prom"), std::string::npos) << bad_name.out;
}

// The run the report, CSV and eval --json tests read: a short real run stopped by SIGTERM at step
// 30 and resumed to its end (3 epochs, 120 steps), then evaluated with eval --json. Trained once
// for all of them: ctest runs ReportRunTraining first (a fixture, tests/CMakeLists.txt) into the
// folder SPOTRAIN_TEST_REPORT_RUN names, and the ReportRun tests, each its own process, read it.
// Without that variable (the binary run by hand) the run goes to a folder of this process's own,
// trained by ReportRunTraining or else by the first ReportRun test.
namespace {

std::string report_run_root() {
  if (const char* d = std::getenv("SPOTRAIN_TEST_REPORT_RUN"); d && *d) return d;
  return (fs::temp_directory_path() / ("spotrain_obs_report_" + std::to_string(getpid()))).string();
}

// Trains the run into ROOT/demo (whatever a previous one left is removed first) and marks it
// whole with ROOT/trained once every command has exited as it should.
void train_report_run(const std::string& root) {
  fs::remove_all(root);
  fs::create_directories(root);
  const std::string dir = root + "/demo";
  const std::string args = "--epochs 3 --train-limit 320 --test-limit 128 --log-every 4 --ckpt-every 15";
  auto a = run_command("SPOTRAIN_FAULT=term:0:30 " + train_cmd(dir, args));
  ASSERT_EQ(a.code, 75) << a.out;
  auto b = run_command(train_cmd(dir, args + " --resume auto"));
  ASSERT_EQ(b.code, 0) << b.out;
  auto e = run_command(kBin + " eval --ckpt " + dir + " --test-limit 128 --json " + dir + "/eval-final.json");
  ASSERT_EQ(e.code, 0) << e.out;
  std::ofstream(root + "/trained") << "trained\n";
}

}  // namespace

TEST(ReportRunTraining, StoppedAtStep30ResumedToTheEndAndEvaluated) {
  train_report_run(report_run_root());
  EXPECT_TRUE(fs::exists(report_run_root() + "/trained"));
}

class ReportRun : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string root = report_run_root();
    dir_ = root + "/demo";
    // Under ctest the fixture trained it (several of these tests may run at once, so none of
    // them trains); by hand, the first test to need it does.
    if (!fs::exists(root + "/trained") && !std::getenv("SPOTRAIN_TEST_REPORT_RUN")) train_report_run(root);
  }
  void SetUp() override {
    ASSERT_TRUE(fs::exists(fs::path(dir_).parent_path() / "trained"))
        << "no trained run in " << dir_ << ": ReportRunTraining trains it (ctest runs it first)";
  }
  // A folder of the test's own for what it writes, beside no other test's.
  static std::string out_dir(const std::string& test) {
    return fresh_dir("report_" + test + "_" + std::to_string(getpid()));
  }
  static std::string dir_;
};
std::string ReportRun::dir_;

TEST_F(ReportRun, EvalJsonHoldsTheResult) {
  json j = json::parse(read_file(dir_ + "/eval-final.json"));
  EXPECT_EQ(j["step"], 120);
  EXPECT_EQ(j["images"], 128);
  EXPECT_GE(j["top1"].get<double>(), 0.0);
  EXPECT_LE(j["top1"].get<double>(), j["top5"].get<double>());
  EXPECT_EQ(j["model"], "resnet20");
}

TEST_F(ReportRun, CsvHasOneRowPerRecordAndAColumnPerField) {
  const std::string csv = out_dir("csv") + "/metrics.csv";
  auto r = run_command(kBin + " report " + dir_ + " --csv " + csv);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_FALSE(fs::exists(dir_ + "/report.html")) << "--csv alone writes no page";
  std::ifstream in(csv);
  std::string header;
  std::getline(in, header);
  EXPECT_EQ(header.rfind("run,type,time,elapsed,epoch,step,", 0), 0u) << header;
  for (const char* col : {",loss,", ",images_per_sec,", ",data_wait_share,", ",host.rss_bytes,", ",phases.forward,", ",test_top1,"})
    EXPECT_NE(("," + header + ",").find(col), std::string::npos) << col;
  size_t rows = 0;
  for (std::string line; std::getline(in, line);) ++rows;
  EXPECT_EQ(rows, records(dir_ + "/metrics.jsonl").size());
}

TEST_F(ReportRun, BadInputIsOneErrorLine) {
  auto missing = run_command(kBin + " report " + dir_ + "/nowhere");
  EXPECT_EQ(missing.code, 1);
  EXPECT_NE(missing.out.find("error: report: "), std::string::npos) << missing.out;
  const std::string empty = out_dir("empty");
  auto none = run_command(kBin + " report " + empty);
  EXPECT_EQ(none.code, 1);
  EXPECT_NE(none.out.find("has no metrics.jsonl"), std::string::npos) << none.out;
}

TEST_F(ReportRun, ThePageRendersInHeadlessChromiumWithoutTheNetwork) {
  if (!chromium_installed()) {
    if (std::getenv("SPOTRAIN_REQUIRE_BROWSER")) FAIL() << "chromium is not installed (scripts/install-deps.sh --test)";
    GTEST_SKIP() << "chromium is not installed (Debian package chromium; scripts/install-deps.sh --test adds it)";
  }
  // Two runs side by side: the demo and a second, shorter one.
  const std::string out = out_dir("page"), second = out + "/second";
  ASSERT_EQ(run_command(train_cmd(second, "--steps 20 --train-limit 320 --test-limit 64 --log-every 4")).code, 0);
  const std::string page = out + "/report.html";
  auto r = run_command(kBin + " report " + dir_ + " " + second + " --price-per-hour 2.5 -o " + page);
  ASSERT_EQ(r.code, 0) << r.out;
  const std::string html = read_file(page);
  EXPECT_NE(html.find("Content-Security-Policy"), std::string::npos);
  EXPECT_NE(html.find("Chart.js v"), std::string::npos) << "Chart.js is embedded";
  EXPECT_FALSE(std::regex_search(html, std::regex(R"((src|href)\s*=\s*["']?(https?:)?//)")))
      << "the page refers to something on the network";

  for (const std::string mode : {"step", "wall"}) {
    auto d = headless_dom(page, mode == "wall" ? "#x=wall" : "");
    ASSERT_EQ(d.code, 0) << d.out.substr(0, 2000);
    const std::string text = selfcheck_text(d.out);
    ASSERT_FALSE(text.empty()) << "the page's script did not finish: " << d.out.substr(0, 2000);
    json check = json::parse(text);
    EXPECT_EQ(check["mode"], mode);
    ASSERT_TRUE(check.contains("violations") && check["violations"].is_array()) << text;
    ASSERT_TRUE(check.contains("resources") && check["resources"].is_array()) << text;
    EXPECT_TRUE(check["violations"].empty()) << check["violations"];
    EXPECT_TRUE(check["resources"].empty()) << "the page fetched: " << check["resources"];
    for (const char* id : {"loss", "accuracy", "lr", "throughput", "datawait", "memory"}) {
      const json& c = check["charts"][id];
      EXPECT_GT(c["series_points"].get<int>(), 10) << id;
      EXPECT_GT(c["series_pixels"].get<int>(), 200) << id << ": the first run's curve is not drawn";
      EXPECT_GT(c["marker_pixels"]["checkpoint"].get<int>(), 20) << id;
      EXPECT_GT(c["marker_pixels"]["stop"].get<int>(), 20) << id;
      EXPECT_GT(c["marker_pixels"]["resume"].get<int>(), 20) << id;
      std::set<std::string> labels;
      for (const json& d : c["datasets"]) labels.insert(d["label"].get<std::string>());
      EXPECT_TRUE(labels.count("checkpoint") && labels.count("resume")) << id;
    }
    EXPECT_EQ(check["charts"]["loss"]["datasets"].size(), 4u + 3u) << "2 runs x (train, test) + 3 marker kinds";
    // Every curve of a chart is told apart in its legend: a colour of its own (the two runs'
    // training and test curves, four colours), and within a run its own point style.
    for (const char* id : {"loss", "accuracy", "memory"}) {
      const json& legend = check["charts"][id]["legend"];
      ASSERT_GE(legend.size(), 4u) << id << ": " << legend.dump();
      std::set<std::string> colors;
      for (const json& item : legend) colors.insert(item["color"].get<std::string>());
      EXPECT_EQ(colors.size(), legend.size()) << id << ": curves share a colour in the legend: " << legend.dump();
      std::set<std::string> styles;
      for (const json& item : legend)
        if (item["text"].get<std::string>().find("(" + fs::path(dir_).filename().string() + ")") != std::string::npos)
          styles.insert(item["point"].get<std::string>());
      EXPECT_EQ(styles.size(), 2u) << id << ": a run's two curves share a point style: " << legend.dump();
    }
    EXPECT_EQ(check["charts"]["gpu"]["series_points"], 0) << "no GPU: nothing to draw";
    EXPECT_GT(check["charts"]["phases"]["series_pixels"].get<int>(), 500);
  }
  // The screenshot: a real page with the curves' colour and the checkpoint markers' green.
  const std::string png = fs::path(page).parent_path().string() + "/report.png";
  auto s = run_command(kHeadlessChromium + "--window-size=1400,2400 --screenshot=" + png + " 'file://" + page + "'");
  ASSERT_TRUE(fs::exists(png)) << s.out;
  std::string bytes = read_file(png);
  std::vector<uint8_t> rgbx;
  int w = 0, h = 0;
  spotrain::io::decode_png_rgbx(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), &rgbx, &w, &h);
  ASSERT_EQ(w, 1400);
  size_t blue = 0, green = 0, ink = 0;
  for (size_t i = 0; i + 3 < rgbx.size(); i += 4) {
    const int R = rgbx[i], G = rgbx[i + 1], B = rgbx[i + 2];
    auto near = [&](int r, int g, int b) { return std::abs(R - r) < 24 && std::abs(G - g) < 24 && std::abs(B - b) < 24; };
    blue += near(0x1f, 0x77, 0xb4);
    green += near(0x2c, 0xa0, 0x2c);
    ink += R + G + B < 600;
  }
  EXPECT_GT(blue, 3000u) << "curves";
  EXPECT_GT(green, 500u) << "checkpoint markers";
  EXPECT_GT(ink, size_t(w) * size_t(h) / 200) << "text and axes";
}

namespace {
using spotrain::find_stragglers;
using spotrain::RankTimes;
using spotrain::RankWatch;
}  // namespace

// Stragglers: a rank at least the threshold x the median over ranks (the lower middle for an
// even count) in compute, or in input when that wait is also a real share of the step.
TEST(RankTimes, NamesTheSlowRankAgainstTheMedianAndNoOneInAnEvenRun) {
  std::vector<RankTimes> even{{0.10, 0.001, 0.02}, {0.11, 0.002, 0.01}, {0.105, 0.001, 0.015}};
  EXPECT_TRUE(find_stragglers(even, 1.2).empty());
  std::vector<RankTimes> one_slow{{0.10, 0.001, 0.30}, {0.40, 0.001, 0.0}, {0.105, 0.001, 0.29}};
  auto s = find_stragglers(one_slow, 1.2);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].rank, 1);
  EXPECT_EQ(s[0].what, "compute");
  EXPECT_NEAR(s[0].ratio(), 0.40 / 0.105, 1e-12);
  // Two ranks: the slower is held against the faster.
  std::vector<RankTimes> two{{0.10, 0, 0.2}, {0.30, 0, 0}};
  s = find_stragglers(two, 1.2);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].rank, 1);
  // Input: a rank starved of data, named for its input; a few milliseconds more is nobody.
  std::vector<RankTimes> starved{{0.10, 0.001, 0.2}, {0.10, 0.20, 0.0}, {0.10, 0.002, 0.2}};
  s = find_stragglers(starved, 1.2);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].rank, 1);
  EXPECT_EQ(s[0].what, "input");
  std::vector<RankTimes> jitter{{0.10, 0.001, 0.01}, {0.10, 0.004, 0.01}, {0.10, 0.002, 0.01}};
  EXPECT_TRUE(find_stragglers(jitter, 1.2).empty());
}

TEST(RankTimes, SlotsCarryOnlyThisRanksTimesAndStreaksCountWindowsInARow) {
  RankWatch w(3, 1, 1.2, {"a", "b", "c"});
  w.add_step(1.0, 0.1, 0.1);  // the first step is not counted
  w.add_step(0.5, 0.05, 0.05);
  w.add_step(0.7, 0.05, 0.05);
  std::vector<double> v = w.slots();
  ASSERT_EQ(v.size(), 9u);
  EXPECT_EQ(v[0], 0.0);
  EXPECT_NEAR(v[3], 0.5, 1e-12);  // (0.4 + 0.6) / 2
  EXPECT_NEAR(v[4], 0.05, 1e-12);
  EXPECT_EQ(v[6], 0.0);
  // A window of fewer than kMinSteps steps names no one.
  const double uneven[9] = {0.1, 0, 0.4, 0.5, 0, 0, 0.1, 0, 0.4};
  EXPECT_TRUE(w.take(uneven).ranks.empty());
  EXPECT_EQ(w.streak(1), 0);
  // The sums every rank gets: rank 1 slow in two windows, then even.
  for (int window = 1; window <= 3; ++window) {
    for (int k = 0; k < RankWatch::kMinSteps; ++k) w.add_step(0.5, 0.0, 0.0);
    const double slow = window < 3 ? 0.5 : 0.1;
    const double summed[9] = {0.1, 0, 0.4, slow, 0, 0, 0.1, 0, 0.4};
    RankWatch::Window got = w.take(summed);
    ASSERT_EQ(got.ranks.size(), 3u);
    if (window < 3) {
      ASSERT_EQ(got.stragglers.size(), 1u);
      EXPECT_EQ(w.streak(1), window);
      EXPECT_NE(w.describe(got.stragglers[0]).find("rank 1 on b: compute"), std::string::npos);
    } else {
      EXPECT_TRUE(got.stragglers.empty());
      EXPECT_EQ(w.streak(1), 0);
    }
  }
}
