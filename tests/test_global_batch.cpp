// The global batch in one place (run/global_batch.h): the even split of a checkpoint's global
// batch over a rank count, one answer for resume, the plan and `spotrain batch`; shares by rate,
// and the rebalancer that moves them (run/rebalance.h).
#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "run/global_batch.h"
#include "run/plan.h"
#include "run/rebalance.h"
#include "run/resume.h"

using namespace spotrain;

namespace {

using P = std::pair<int64_t, int>;  // micro-batch, micro-batches per rank

P split(int64_t global, int world, int64_t max_micro) {
  const BatchSplit s = split_evenly(global, world, max_micro);
  EXPECT_TRUE(s.even());
  EXPECT_EQ(s.global(), global);
  return {s.micro, s.count(0)};
}

std::string refusal(int64_t global, int world, int64_t max_micro) {
  BatchSplit s;
  std::string why;
  EXPECT_FALSE(split_evenly(global, world, max_micro, &s, &why)) << global << " over " << world;
  return why;
}

}  // namespace

// Fewer ranks keep the per-rank batch (--batch-size) and take more micro-batches, more ranks
// fewer, then a smaller per-rank batch; the same rank count gives the run's own split back.
TEST(GlobalBatch, AShrinkKeepsThePerRankBatchAndMultipliesTheMicroBatches) {
  // Started on 4 ranks x 32 (global 128).
  EXPECT_EQ(split(128, 4, 32), (P{32, 1}));
  EXPECT_EQ(split(128, 2, 32), (P{32, 2}));  // shrunk to 2: the same batch, two micro-batches
  EXPECT_EQ(split(128, 1, 32), (P{32, 4}));
  EXPECT_EQ(split(128, 8, 32), (P{16, 1}));  // grown: fewer micro-batches first, then smaller batches
  // A smaller --batch-size on the same ranks (less memory per GPU): more micro-batches.
  EXPECT_EQ(split(128, 4, 16), (P{16, 2}));
  // A share that --batch-size does not divide: the fewest equal micro-batches that fit.
  EXPECT_EQ(split(96, 2, 32), (P{24, 2}));
  EXPECT_EQ(split(1200, 4, 256), (P{150, 2}));
}

TEST(GlobalBatch, NoSplitNamesTheRankCountsThatWork) {
  // 128 over 3 ranks: no whole per-rank batch.
  std::string e = refusal(128, 3, 32);
  EXPECT_NE(e.find("does not divide over 3 ranks"), std::string::npos) << e;
  EXPECT_NE(e.find("It divides over 1, 2, 4, 8, 16, 32, 64 or 128 ranks"), std::string::npos) << e;
  EXPECT_EQ(e.find('\n'), std::string::npos) << "one line";
  // 2 x 509 over 2 ranks at most 128 each: 509 is prime, and micro-batches of 1 are no split.
  e = refusal(1018, 2, 128);
  EXPECT_NE(e.find("into equal micro-batches of at most --batch-size 128 and at least half of it (509 images "
                   "per rank and step)"), std::string::npos) << e;
  EXPECT_NE(e.find("or with a --batch-size that divides 509"), std::string::npos) << e;
  // Many counts: the first twelve, and how many more.
  e = refusal(1 << 20, 3, 1);
  EXPECT_NE(e.find("It divides over 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048 or one of 9 larger rank counts"),
            std::string::npos) << e;
  EXPECT_EQ(rank_counts_that_split(96, 32, 8), (std::vector<int>{1, 2, 3, 4, 6, 8}));
}

// One rule: for every rank count from 1 to 64 and a few global batches, the split a resume on
// that many ranks trains with (run_split, from the checkpoint's record) is the one the plan
// prices a fleet of that many GPUs at (plan_offers, its rows' batch), and where a resume would
// refuse, the plan leaves the fleet out.
TEST(GlobalBatch, ThePlansFitAndAResumeAgreeOnEveryRankCount) {
  RunConfig cfg;
  cfg.model = "resnet50";
  PlanInput in;
  in.work.model = "resnet50";
  in.work.precision = "fp16";
  in.work.data = "synthetic";
  in.max_hosts = 1;  // one host of `gpus` GPUs per offer
  in.show_unproven = true;
  BenchFile bench;
  bench.path = "bench.json";
  bench.gpu = "TESTGPU";
  bench.model = "resnet50";
  bench.precision = "fp16";
  bench.image_size = 224;
  bench.ips = bench.ips_per_rank = 1000;
  for (int64_t max_micro : {128, 256}) {
    for (int64_t global : {int64_t(256), int64_t(1200), int64_t(1536), int64_t(4096), int64_t(3000)}) {
      cfg.batch_size = max_micro;
      in.work.batch_size = int(max_micro);
      in.work.global_batch = global;
      bench.batch = int(max_micro);
      std::vector<Offer> offers;
      for (int gpus = 1; gpus <= 64; ++gpus) {
        Offer o;
        o.name = "o" + std::to_string(gpus);
        o.gpu = "TESTGPU";
        o.gpus_per_host = gpus;
        o.on_demand = o.spot = 1;
        o.spot_mtbf_h = 1000;
        o.network_gbps = 100;
        offers.push_back(o);
      }
      const Planned planned = plan_offers(in, offers, {bench});
      for (int gpus = 1; gpus <= 64; ++gpus) {
        ResumePoint from;
        from.found = true;
        from.checkpoint = "ckpt.h5";
        from.global_batch = global;
        from.world = 8;
        std::string resumed;
        try {
          resumed = run_split(cfg, from, gpus).text();
        } catch (const Error& e) {
          resumed = "refused";
        }
        std::string planned_split = "refused";
        for (const PlanRow& r : planned.rows)
          if (r.offer->gpus_per_host == gpus) planned_split = r.batch.text();
        EXPECT_EQ(planned_split, resumed) << global << " images over " << gpus << " GPUs of at most " << max_micro;
      }
    }
  }
}

// The first split: --batch-size per micro-batch, --accum-steps of them on every rank.
TEST(GlobalBatch, AFirstSplitIsTheSettingsProduct) {
  const BatchSplit s = first_split(4, 32, 2);
  EXPECT_EQ(s.global(), 256);
  EXPECT_EQ(s.units(), 8);
  EXPECT_EQ(s.first(3), 6);
  EXPECT_EQ(s.text(), "32 x 2 micro-batches per rank");
  EXPECT_EQ(first_split(2, 64, 1).text(), "64 per rank");
  EXPECT_THROW(global_batch(0, 4, 1), Error);
  EXPECT_THROW(global_batch(int64_t(1) << 30, 1 << 12, 1 << 12), Error);  // past the sample counters
}

// Shares by rate: the counts whose slowest rank finishes first; equal rates split evenly.
TEST(GlobalBatch, SharesFollowRatesAndEqualRatesStayEven) {
  EXPECT_EQ(counts_by_rate(12, {1, 1, 1}), (std::vector<int>{4, 4, 4}));
  EXPECT_EQ(counts_by_rate(12, {0.4, 0.4, 0.2}), (std::vector<int>{5, 5, 2}));
  EXPECT_EQ(counts_by_rate(4, {1, 1, 1}), (std::vector<int>{2, 1, 1}));  // ties to the lower rank
  EXPECT_EQ(counts_by_rate(6, {10, 1, 1}), (std::vector<int>{4, 1, 1}));  // none below one
  EXPECT_EQ(counts_by_rate(6, {10, 1, 1}, 2), (std::vector<int>{2, 2, 2}));
  EXPECT_THROW(counts_by_rate(2, {1, 1, 1}), Error);
  EXPECT_NEAR(split_slowdown({4, 4, 4}, {1, 1, 1}), 1.0, 1e-12);
  // Three ranks, one at half speed: even, 5 x 4 / (12 / 2.5) = 2.5 / 1.2; by rate 12.5 / 12.
  EXPECT_NEAR(split_slowdown({4, 4, 4}, {1, 1, 0.5}), 8.0 / 4.8, 1e-12);
  EXPECT_NEAR(split_slowdown({5, 5, 2}, {1, 1, 0.5}), 5.0 / 4.8, 1e-12);
  // An uneven split's micro-batches, in rank order.
  BatchSplit s;
  s.micro = 32;
  s.counts = {5, 5, 2};
  EXPECT_EQ(s.first(2), 10);
  EXPECT_EQ(s.global(), 384);
  EXPECT_FALSE(s.even());
  EXPECT_EQ(s.text(), "micro-batches of 32: 5, 5, 2 per rank");
}

namespace {

// A window of per-step compute seconds by rank (no input, no waits).
RankWatch::Window window(const std::vector<double>& compute) {
  RankWatch::Window w;
  for (double c : compute) w.ranks.push_back(RankTimes{c, 0, 0});
  return w;
}

// The per-step compute of each rank under `s` at `speed` images per second.
std::vector<double> compute_of(const BatchSplit& s, const std::vector<double>& speed) {
  std::vector<double> c;
  for (int r = 0; r < s.world(); ++r) c.push_back(double(s.count(r) * s.micro) / speed[size_t(r)]);
  return c;
}

}  // namespace

// A fleet of equal ranks keeps its shares through noise of +-8% per window; a rank at half speed
// gets fewer micro-batches after two windows that call for it, none in the window after.
TEST(Rebalancer, EqualRanksStayEvenAndAHalfSpeedRankGetsLess) {
  const BatchSplit first = first_split(3, 16, 4);
  Rebalancer even(first);
  const std::vector<std::vector<double>> noise = {{1.0, 1.08, 0.92}, {0.93, 1.0, 1.07}, {1.08, 0.92, 1.0}};
  for (int i = 0; i < 12; ++i)
    EXPECT_FALSE(even.weigh(window(compute_of(first, noise[size_t(i % 3)])), first)) << "window " << i;
  Rebalancer uneven(first);
  const std::vector<double> speed = {200, 200, 100};
  EXPECT_FALSE(uneven.weigh(window(compute_of(first, speed)), first)) << "one window is not enough";
  const std::optional<BatchSplit> next = uneven.weigh(window(compute_of(first, speed)), first);
  ASSERT_TRUE(next);
  EXPECT_EQ(next->counts, (std::vector<int>{5, 5, 2}));
  EXPECT_EQ(next->micro, 16);
  EXPECT_NE(uneven.last_line().find("micro-batches of 16 per rank 5, 5, 2 (were 4, 4, 4)"), std::string::npos)
      << uneven.last_line();
  EXPECT_EQ(uneven.last_record()["micro_batches"], nlohmann::json({5, 5, 2}));
  // The window that held the change is not weighed; after it, the new split holds.
  EXPECT_FALSE(uneven.weigh(window(compute_of(*next, speed)), *next));
  for (int i = 0; i < 4; ++i) EXPECT_FALSE(uneven.weigh(window(compute_of(*next, speed)), *next));
  // Restored to full speed: back to even.
  std::optional<BatchSplit> back;
  for (int i = 0; i < 6 && !back; ++i) back = uneven.weigh(window(compute_of(*next, {200, 200, 200})), *next);
  ASSERT_TRUE(back);
  EXPECT_EQ(back->counts, (std::vector<int>{4, 4, 4}));
}

// One micro-batch per rank is too coarse for a half-speed rank: the micro-batch is halved (down
// to a quarter of the first, never below 8 images); where it cannot be, the shares stay.
TEST(Rebalancer, WholeMicroBatchesTooCoarseAreHalved) {
  const BatchSplit first = first_split(3, 64, 1);
  EXPECT_EQ(Rebalancer::why_shares_stay(first), "");
  Rebalancer r(first);
  const std::vector<double> speed = {200, 200, 100};
  r.weigh(window(compute_of(first, speed)), first);
  const std::optional<BatchSplit> next = r.weigh(window(compute_of(first, speed)), first);
  ASSERT_TRUE(next);
  EXPECT_EQ(next->global(), first.global());
  EXPECT_EQ(next->micro, 16);  // 64 / 4: (5, 5, 2) of 12, where 6 of 32 could not split well
  EXPECT_EQ(next->counts, (std::vector<int>{5, 5, 2}));
  EXPECT_NE(r.last_line().find("(were 1, 1, 1 of 64: whole ones were too coarse)"), std::string::npos) << r.last_line();
  EXPECT_NE(Rebalancer::why_shares_stay(first_split(3, 15, 1)).find("cannot be halved (an odd number of images)"),
            std::string::npos);
  EXPECT_NE(Rebalancer::why_shares_stay(first_split(3, 14, 1)).find("cannot be halved (fewer than 16 images)"),
            std::string::npos);
  EXPECT_NE(Rebalancer::why_shares_stay(first_split(2, 8, 1)), "");
  EXPECT_EQ(Rebalancer::why_shares_stay(first_split(2, 8, 2)), "");
}
