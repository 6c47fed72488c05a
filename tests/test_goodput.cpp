// The goodput model (run/goodput.h) against its own limits and properties: Daly's failure term
// at the extremes and at its optimum, the all-reduce term, a notice, the survivors' recovery,
// and the prediction for a measured run.
#include <gtest/gtest.h>

#include <cmath>

#include "run/goodput.h"

using namespace spotrain;

// Without failures only the checkpoints cost: T of work per T + C of time.
TEST(Goodput, DalyWithoutFailuresIsTheCheckpointsShare) {
  EXPECT_NEAR(daly_failure_goodput(100, 1, 60, 1e12), 100.0 / 101.0, 1e-6);
  EXPECT_EQ(daly_failure_goodput(100, 1, 60, 0), 1.0) << "M = 0 means never reclaimed";
}

// A failure at a uniform point of an interval loses half of it on average: for T, C, R << M
// the time per T of work is about T + C + (T/2 + R) T/M.
TEST(Goodput, DalyForRareFailuresLosesHalfAnIntervalAndTheRestartEach) {
  const double T = 60, C = 0.5, R = 120, M = 1e6;
  const double first_order = T / (T + C + (T / 2 + R + C / 2) * (T + C) / M);
  EXPECT_NEAR(daly_failure_goodput(T, C, R, M, false), first_order, 1e-6);
  EXPECT_LT(daly_failure_goodput(T, C, R, M, true), daly_failure_goodput(T, C, R, M, false))
      << "failures during restarts cost more";
  EXPECT_LT(daly_failure_goodput(T, C, 2 * R, M), daly_failure_goodput(T, C, R, M));
}

// Young's interval is where Daly's goodput peaks (first order, C << M).
TEST(Goodput, YoungsIntervalIsWhereDalysGoodputPeaks) {
  const double C = 0.05, R = 120, M = 3 * 3600.0;
  double best_t = 0, best = 0;
  for (double t = 1; t < 600; t += 0.25) {
    const double g = daly_failure_goodput(t, C, R, M);
    if (g > best) best = g, best_t = t;
  }
  EXPECT_NEAR(best_t / young_daly_interval(C, M), 1.0, 0.05) << best_t << " against " << young_daly_interval(C, M);
}

// The all-reduce: hidden under backward on a fast link, exposed on a slow one and more so with
// more hosts; one host all-reduces nothing between hosts.
TEST(Goodput, TheAllReduceIsExposedOnlyBeyondWhatBackwardHides) {
  SpotJob j;
  j.step_s = 0.3;
  j.grad_bytes = 102e6;
  j.link_bytes_s = 400e9 / 8;
  j.hosts = 64;
  EXPECT_EQ(estimate_goodput(j).comm_exposed_s, 0.0);
  EXPECT_EQ(estimate_goodput(j).goodput, 1.0);
  j.link_bytes_s = 1e9 / 8;  // 1 Gb/s
  const Goodput slow64 = estimate_goodput(j);
  EXPECT_GT(slow64.comm_exposed_s, 0.0);
  EXPECT_NEAR(slow64.step_efficiency, j.step_s / (j.step_s + slow64.comm_exposed_s), 1e-12);
  j.hosts = 2;
  EXPECT_LT(estimate_goodput(j).comm_exposed_s, slow64.comm_exposed_s);
  j.hosts = 1;
  EXPECT_EQ(estimate_goodput(j).comm_exposed_s, 0.0);
}

// Spot: the job fails as often as any of its hosts, so goodput falls with the host count; the
// interval is Young's (at least a write).
TEST(Goodput, MoreHostsFailMoreOften) {
  SpotJob j;
  j.step_s = 0.3;
  j.host_mtbf_s = 24 * 3600;
  double previous = 1.0;
  for (int n : {1, 8, 64, 512}) {
    j.hosts = n;
    const Goodput g = estimate_goodput(j);
    EXPECT_DOUBLE_EQ(g.job_mtbf_s, j.host_mtbf_s / n);
    EXPECT_DOUBLE_EQ(g.interval_s, std::max(young_daly_interval(j.ckpt_cost_s, g.job_mtbf_s), j.ckpt_write_s));
    EXPECT_LT(g.goodput, previous) << n;
    previous = g.goodput;
  }
}

// A notice that covers the step and a checkpoint loses no work: each reclaim costs the stop and
// the restart; a notice too short for that is a hard reclaim.
TEST(Goodput, ANoticeLongEnoughLosesNoWork) {
  SpotJob j;
  j.hosts = 64;
  j.step_s = 0.3;
  j.host_mtbf_s = 6 * 3600;
  j.ckpt_cost_s = 2;  // a slow checkpoint: a hard reclaim loses much
  const Goodput hard = estimate_goodput(j);
  EXPECT_FALSE(hard.notice_covers_stop);
  j.notice_s = 30;
  const Goodput noticed = estimate_goodput(j);
  EXPECT_TRUE(noticed.notice_covers_stop);
  const double M = j.host_mtbf_s / j.hosts;
  EXPECT_NEAR(noticed.failure_goodput, M / (M + j.step_s + j.ckpt_write_s + j.restart_s), 1e-12);
  EXPECT_GT(noticed.goodput, hard.goodput);
  j.notice_s = 1;  // shorter than a step and a write
  EXPECT_FALSE(estimate_goodput(j).notice_covers_stop);
  EXPECT_DOUBLE_EQ(estimate_goodput(j).goodput, hard.goodput);
}

// The survivors' recovery: no lost work and no wait for a replacement, so it beats a restart
// where restarts dominate; with one host there are no survivors.
TEST(Goodput, TheSurvivorsRecoveryPaysWhereRestartsDominate) {
  SpotJob j;
  j.step_s = 0.3;
  j.host_mtbf_s = 24 * 3600;
  j.hosts = 512;
  const double today = estimate_goodput(j).goodput;
  j.survivors = true;
  const double survivors = estimate_goodput(j).goodput;
  EXPECT_GT(survivors, today * 1.3) << today << " " << survivors;
  const double M = j.host_mtbf_s / j.hosts;
  EXPECT_NEAR(estimate_goodput(j).failure_goodput,
              M / (M + j.survivor_restart_s + j.step_s / 2 + j.replacement_s / j.hosts + j.grow_restart_s), 1e-12);
  j.hosts = 1;
  SpotJob alone = j;
  alone.survivors = false;
  EXPECT_DOUBLE_EQ(estimate_goodput(j).goodput, estimate_goodput(alone).goodput);
}

// A measured run that lost exactly what the model says a hard reclaim loses (half an interval
// and half a checkpoint), and took no time beyond its start-up, steps and restarts, is predicted
// exactly; one that lost more, or whose wall time holds more, measures below the model.
TEST(Goodput, APredictionFromARunsOwnCosts) {
  MeasuredSpotRun r;
  r.hosts = 2;
  r.mtbf_s = 30;
  r.step_time_s = 28;  // seconds of surviving steps
  r.checkpoints = 20;
  r.checkpoint_held_s = 2;
  r.restarts = r.preemptions = 4;
  r.restart_s = 10;
  r.startup_s = 3;
  const double T = r.step_time_s / r.checkpoints, C = r.checkpoint_held_s / r.checkpoints;
  r.lost_s = r.preemptions * (T + C) / 2;
  r.wall_s = r.startup_s + r.step_time_s + r.lost_s + r.restarts * r.restart_s;
  r.goodput = r.step_time_s / r.wall_s;
  EXPECT_NEAR(predicted_goodput(r), r.goodput, 1e-12);
  MeasuredSpotRun worse = r;  // lost 20 s more: the model does not take it from the wall time
  worse.lost_s += 20;
  worse.wall_s += 20;
  worse.goodput = worse.step_time_s / worse.wall_s;
  EXPECT_LT(worse.goodput, predicted_goodput(worse) * 0.85);
  MeasuredSpotRun slow = r;  // 20 s the model has no term for (a slow exit, a hung restart)
  slow.wall_s += 20;
  slow.goodput = slow.step_time_s / slow.wall_s;
  EXPECT_LT(slow.goodput, predicted_goodput(slow) * 0.85);
  // The survivors lose no work: a run that lost none is predicted exactly.
  MeasuredSpotRun s = r;
  s.recovery = "survivors";
  s.lost_s = 0;
  s.wall_s = s.startup_s + s.step_time_s + s.restarts * s.restart_s;
  s.goodput = s.step_time_s / s.wall_s;
  EXPECT_NEAR(predicted_goodput(s), s.goodput, 1e-12);
  // At the expected count instead of its own: the start-up, and the steps over Daly's term.
  EXPECT_NEAR(expected_goodput(r),
              r.step_time_s / (r.startup_s + r.step_time_s / daly_failure_goodput(T, C, r.restart_s, r.mtbf_s / r.hosts, false)),
              1e-12);
}

// --straggler-action leave's rule: a host at a quarter of the others' speed leaves when the
// rest of the run is long enough to repay the restart; one 1.1x slower never does (the others
// would each take ranks / (ranks - 1) of the work: slower than waiting for it).
// Three ranks, one on the host weighed; an all-reduce exposed 0.01 s a step; a restart of 20 s.
namespace {
LeaveCase three_ranks_one_leaving() {
  LeaveCase c;
  c.ranks = 3;
  c.leaving = 1;
  c.exposed_s = 0.01;
  c.restart_s = 20;
  return c;
}
}  // namespace

TEST(Goodput, LeavingAQuarterSpeedHostPaysOnlyWhenTheRestOfTheRunRepaysTheRestart) {
  LeaveCase c = three_ranks_one_leaving();
  c.others_busy_s = 0.1;
  c.step_s = 0.41;  // the slow rank: 4x the others' 0.1 s, plus the exposed all-reduce
  c.steps_left = 1000;
  LeaveDecision d = decide_leave(c);
  EXPECT_NEAR(d.step_without_s, 0.1 * 1.5 + 0.01, 1e-12);
  EXPECT_NEAR(d.with_s, 410, 1e-9);
  EXPECT_NEAR(d.without_s, 20 + 160, 1e-9);
  EXPECT_TRUE(d.pays);
  c.steps_left = 50;  // 20.5 s with it against 20 + 8 s without
  EXPECT_FALSE(decide_leave(c).pays);
  c.steps_left = 1000000;
  c.step_s = 0.11 + 0.01;  // 1.1x slower
  EXPECT_FALSE(decide_leave(c).pays);
}

// With shares that follow rates the slow host's share has already moved to the others: leaving
// it saves only what the coarse split still costs, so a quarter-speed host that leaves under even
// shares stays; one so slow that even the smallest share holds the step up still leaves.
TEST(Goodput, SharesByRateWeighTheRebalancedStepAgainstTheOthersAlone) {
  LeaveCase c = three_ranks_one_leaving();
  c.steps_left = 1000000;
  c.global_batch = 96;
  c.others_rate = 800;  // two ranks at 400 images/s; the third at 100
  // The best split of 12 micro-batches of 8 at these rates: 6, 5, 1 (the first rank's 48 images
  // take 0.12 s; 5, 5, 2 would take 0.16 s on the slow rank).
  c.step_s = 48.0 / 400 + c.exposed_s;
  LeaveDecision d = decide_leave(c);
  EXPECT_NEAR(d.step_without_s, 96.0 / 800 + 0.01, 1e-12);  // 48 each at 400/s
  EXPECT_FALSE(d.pays);
  c.others_busy_s = 0.1;  // the same host under even shares: 32 images each, the slow one 0.32 s
  c.others_rate = 0;
  c.step_s = 0.32 + c.exposed_s;
  EXPECT_TRUE(decide_leave(c).pays);
  c.others_rate = 800;  // a host at 10 images/s, whose smallest share (8) holds every step up
  c.step_s = 8.0 / 10 + c.exposed_s;
  EXPECT_TRUE(decide_leave(c).pays);
}

TEST(Goodput, NoRankLeftMeansNoLeaving) {
  LeaveCase c;
  c.ranks = 2;
  c.leaving = 2;  // both ranks on the one host
  c.step_s = 1;
  c.steps_left = 100;
  EXPECT_FALSE(decide_leave(c).pays);
}
