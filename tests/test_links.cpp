// The link check's decisions (health/links.h), without a network: the round-robin rounds meet
// every pair of hosts exactly once, a host's figure is the best of its pairs (so one slow host
// does not drag the others down), and the verdicts hold each host against the median and the
// floor. The measurement itself runs in test_health_gate (mpirun, namespace hosts).
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <utility>
#include <vector>

#include "health/links.h"

using spotrain::health::DoctorCheck;
using spotrain::health::HostLink;
using spotrain::health::LinkOptions;
using spotrain::health::Verdict;

namespace {

const double kGbit = 1e9 / 8;  // bytes/s in a Gbit/s

std::vector<HostLink> hosts_at(const std::vector<double>& gbps) {
  std::vector<HostLink> v;
  for (size_t i = 0; i < gbps.size(); ++i) v.push_back({"h" + std::to_string(i), gbps[i] * kGbit, "peer"});
  return v;
}

}  // namespace

TEST(Links, RoundRobinMeetsEveryPairExactlyOnce) {
  for (int n = 1; n <= 9; ++n) {
    const auto rounds = spotrain::health::round_robin_rounds(n);
    EXPECT_EQ(int(rounds.size()), n == 1 ? 1 : n % 2 == 0 ? n - 1 : n) << n;
    std::set<std::pair<int, int>> met;
    for (const auto& partner : rounds) {
      ASSERT_EQ(int(partner.size()), n);
      int idle = 0;
      for (int r = 0; r < n; ++r) {
        const int p = partner[size_t(r)];
        if (p < 0) {
          ++idle;
          continue;
        }
        ASSERT_NE(p, r) << "rank " << r << " paired with itself, n " << n;
        ASSERT_EQ(partner[size_t(p)], r) << "pairing not mutual, n " << n;
        if (r < p) {
          EXPECT_TRUE(met.insert({r, p}).second) << r << "-" << p << " met twice, n " << n;
        }
      }
      EXPECT_EQ(idle, n % 2) << "a round left the wrong number of ranks idle, n " << n;
    }
    EXPECT_EQ(int(met.size()), n * (n - 1) / 2) << n;
  }
}

// A pair is as fast as the slower of its two sides saw it; a host's figure is its best pair.
TEST(Links, AHostsFigureIsItsBestPairSoOneSlowHostDragsNoOtherDown) {
  // Host 2's link is slow: every pair with it is slow, the pair 0-1 is fast.
  const std::vector<std::vector<double>> rates = {{0, 9e8, 2e6}, {1e9, 0, 2.5e6}, {3e6, 2.4e6, 0}};
  const auto h = spotrain::health::host_links(rates, {"a", "b", "c"});
  ASSERT_EQ(h.size(), 3u);
  EXPECT_DOUBLE_EQ(h[0].bytes_per_sec, 9e8);
  EXPECT_EQ(h[0].best_peer, "b");
  EXPECT_DOUBLE_EQ(h[1].bytes_per_sec, 9e8);
  EXPECT_DOUBLE_EQ(h[2].bytes_per_sec, 2.4e6);  // min(2.5e6, 2.4e6) beats min(2e6, 3e6)
  EXPECT_EQ(h[2].best_peer, "b");
  const auto checks = spotrain::health::judge_links(h, LinkOptions{});
  ASSERT_EQ(checks.size(), 3u);
  EXPECT_EQ(checks[0].verdict, Verdict::ok);
  EXPECT_EQ(checks[1].verdict, Verdict::ok);
  EXPECT_EQ(checks[2].verdict, Verdict::fail);
  EXPECT_EQ(checks[2].name, "link c");
  EXPECT_NE(checks[2].figure.find("19.2 Mbit/s (its best pair, with b), 0.00x the median 7.20 Gbit/s"),
            std::string::npos) << checks[2].line();
  EXPECT_NE(checks[2].limit.find("fails below 0.50x the median"), std::string::npos) << checks[2].line();
}

TEST(Links, AHostBelowTheShareOfTheMedianFails) {
  LinkOptions opt;
  opt.min_share = 0.5;
  // Median 10: 4.9 fails, 5.0 passes.
  auto c = spotrain::health::judge_links(hosts_at({10, 10, 4.9, 5.0, 12}), opt);
  EXPECT_EQ(c[0].verdict, Verdict::ok);
  EXPECT_EQ(c[2].verdict, Verdict::fail) << c[2].line();
  EXPECT_EQ(c[3].verdict, Verdict::ok) << c[3].line();
  EXPECT_EQ(c[4].verdict, Verdict::ok);
  // An even count: the median is the mean of the middle two (8 and 10 -> 9): 4.4 fails.
  c = spotrain::health::judge_links(hosts_at({8, 10, 4.4, 11}), opt);
  EXPECT_EQ(c[2].verdict, Verdict::fail) << c[2].line();
  EXPECT_NE(c[2].figure.find("the median 9.00 Gbit/s"), std::string::npos) << c[2].line();
  // Share 0: only the floor (none here) or no figure at all fails.
  opt.min_share = 0;
  c = spotrain::health::judge_links(hosts_at({8, 10, 0.01, 11}), opt);
  for (const DoctorCheck& x : c) EXPECT_EQ(x.verdict, Verdict::ok) << x.line();
}

// Two hosts share their one pair's figure: the median cannot tell them apart, the floor can.
TEST(Links, TwoHostsAreToldApartOnlyByTheFloor) {
  LinkOptions opt;
  auto c = spotrain::health::judge_links(hosts_at({0.02, 0.02}), opt);
  EXPECT_EQ(c[0].verdict, Verdict::ok);
  EXPECT_EQ(c[1].verdict, Verdict::ok);
  opt.min_gbps = 1;
  c = spotrain::health::judge_links(hosts_at({0.02, 0.02}), opt);
  EXPECT_EQ(c[0].verdict, Verdict::fail) << c[0].line();
  EXPECT_NE(c[0].limit.find("or below 1.00 Gbit/s"), std::string::npos) << c[0].line();
}

TEST(Links, AHostWithNoPairMeasuredFails) {
  auto c = spotrain::health::judge_links(hosts_at({10, 0, 10}), LinkOptions{});
  EXPECT_EQ(c[1].verdict, Verdict::fail);
  EXPECT_EQ(c[1].figure, "no pair measured");
}

TEST(Links, RatesReadAsNetworkLinksAreQuoted) {
  EXPECT_EQ(spotrain::health::fmt_link_rate(12.5e9 / 8 * 8), "100.00 Gbit/s");
  EXPECT_EQ(spotrain::health::fmt_link_rate(2.5e6), "20.0 Mbit/s");
  EXPECT_EQ(spotrain::health::fmt_link_rate(1000), "8.0 kbit/s");
}
