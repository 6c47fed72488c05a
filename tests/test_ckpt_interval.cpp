// --ckpt-every auto: Young/Daly's interval from hand values, the floor at twice the write, the
// job's MTBF shrinking with its hosts, and a real run that measures its checkpoint cost, logs
// the interval with its inputs and checkpoints at about that pace.
#include <gtest/gtest.h>

#include <algorithm>

#include <cmath>
#include <filesystem>
#include <regex>
#include <string>

#include "run/ckpt_interval.h"
#include "run_command.h"

namespace fs = std::filesystem;
using spotrain::AutoCheckpointInterval;
using spotrain::young_daly_interval;

TEST(CkptInterval, YoungDalyFromHandValues) {
  EXPECT_DOUBLE_EQ(young_daly_interval(0.5, 3600), 60.0);     // sqrt(2 x 0.5 x 3600)
  EXPECT_DOUBLE_EQ(young_daly_interval(2.0, 6 * 3600), std::sqrt(2.0 * 2.0 * 21600));
  EXPECT_DOUBLE_EQ(young_daly_interval(0, 3600), 0.0);
}

TEST(CkptInterval, TheJobFailsAsOftenAsAnyOfItsHosts) {
  AutoCheckpointInterval one{7200, 1}, eight{7200, 8};
  EXPECT_DOUBLE_EQ(one.seconds(0.25, 0), 60.0);               // sqrt(2 x 0.25 x 7200)
  EXPECT_DOUBLE_EQ(eight.seconds(0.25, 0), std::sqrt(2 * 0.25 * 900));
  EXPECT_NEAR(one.seconds(0.25, 0) / eight.seconds(0.25, 0), std::sqrt(8.0), 1e-12);
}

TEST(CkptInterval, NeverShorterThanAWrite) {
  AutoCheckpointInterval a{3600, 1};
  EXPECT_DOUBLE_EQ(a.seconds(0.02, 0.5), std::sqrt(2 * 0.02 * 3600));  // 12 s > 0.5 s
  EXPECT_DOUBLE_EQ(a.seconds(0.02, 20), 20.0);                         // the 20 s write
  EXPECT_NE(a.explain(0.02, 20).find("raised to the 20.000 s background write"), std::string::npos);
}

// A short run with --mtbf 1m: the log states the interval with its inputs (the measured cost),
// and the interval it states is Young/Daly of those inputs; checkpoints come at that pace.
TEST(CkptInterval, ARunMeasuresItsCostAndCheckpointsAtTheInterval) {
  fs::path d = fs::temp_directory_path() / "spotrain_ckpt_auto";
  fs::remove_all(d);
  CommandResult r = run_command(std::string(SPOTRAIN_BIN) +
                                " train --model resnet20 --data synthetic --train-limit 4096 --test-limit 16"
                                " --batch-size 16 --threads 1 --steps 200 --log-every 20 --keep 1000"
                                " --ckpt-every auto --mtbf 1m --ckpt-dir " + d.string());
  ASSERT_EQ(r.code, 0) << r.out;
  std::smatch m;
  const std::regex line("checkpoint interval \\(--ckpt-every auto\\): ([0-9.]+) s; Young/Daly sqrt\\(2 x ([0-9.]+) s cost x "
                        "60 s job MTBF \\(60 s / 1 host\\)\\) = ([0-9.]+) s");
  ASSERT_TRUE(std::regex_search(r.out, m, line)) << r.out;
  const double interval = std::stod(m[1]), cost = std::stod(m[2]), yd = std::stod(m[3]);
  // (the log rounds the cost to 0.1 ms and the intervals to 10 ms)
  EXPECT_NEAR(yd, std::sqrt(2 * cost * 60), 0.02 + 0.05 * yd);
  EXPECT_GE(interval, yd - 0.01);
  // The interval is logged again when the measured cost moves it (the first estimate, the
  // buffers' first touch, can be far off under load): the pace is bounded by the shortest.
  double shortest = interval;
  for (std::sregex_iterator it(r.out.begin(), r.out.end(), line), end; it != end; ++it)
    shortest = std::min(shortest, std::stod((*it)[1]));
  // Every checkpoint but the last is a periodic one here (one epoch is 256 steps): at least
  // two, and no more than the run's length allows at the shortest logged interval's pace.
  int files = 0;
  for (auto& e : fs::directory_iterator(d)) files += e.path().extension() == ".h5";
  std::smatch t;
  ASSERT_TRUE(std::regex_search(r.out, t, std::regex("finished 200 steps in ([0-9.]+)s"))) << r.out;
  EXPECT_GE(files - 1, 2) << r.out;
  EXPECT_LE(files - 1, int(std::stod(t[1]) / (0.5 * shortest)) + 2) << r.out;
  fs::remove_all(d);
}
