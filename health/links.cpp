// The link check (see links.h): pairs measured over MPI point to point, one all-reduce timed,
// and the verdicts against the median host.
#include "health/links.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "comm/communicator.h"
#include "comm/hosts.h"
#include "core/clock.h"
#include "core/error.h"
#include "core/log.h"

namespace spotrain::health {

std::vector<std::vector<int>> round_robin_rounds(int n) {
  SPOTRAIN_CHECK(n >= 1, "round_robin_rounds: n must be 1 or more, not ", n);
  // The circle method: m players (n, plus a bye when n is odd); the last stays put while the
  // others turn, so each round pairs everyone once and every pair meets in exactly one round.
  const int m = n % 2 == 0 ? n : n + 1;
  std::vector<std::vector<int>> rounds;
  for (int r = 0; r + 1 < m; ++r) {
    std::vector<int> partner(size_t(n), -1);
    auto pair = [&](int a, int b) {
      if (a < n && b < n) {
        partner[size_t(a)] = b;
        partner[size_t(b)] = a;
      }
    };
    pair(r, m - 1);
    for (int i = 1; i < m / 2; ++i) pair((r + i) % (m - 1), (r - i + m - 1) % (m - 1));
    rounds.push_back(std::move(partner));
  }
  return rounds;
}

std::vector<HostLink> host_links(const std::vector<std::vector<double>>& rates,
                                 const std::vector<std::string>& names) {
  const size_t n = names.size();
  SPOTRAIN_CHECK(rates.size() == n, "host_links: ", rates.size(), " rows of rates for ", n, " hosts");
  std::vector<HostLink> hosts(n);
  for (size_t i = 0; i < n; ++i) {
    SPOTRAIN_CHECK(rates[i].size() == n, "host_links: row ", i, " has ", rates[i].size(), " rates, not ", n);
    hosts[i].name = names[i];
    for (size_t j = 0; j < n; ++j) {
      if (j == i) continue;
      // A pair is as fast as its slower side saw it; an unmeasured side leaves the other's.
      const double a = rates[i][j], b = rates[j][i];
      const double pair = a > 0 && b > 0 ? std::min(a, b) : std::max(a, b);
      if (pair > hosts[i].bytes_per_sec) {
        hosts[i].bytes_per_sec = pair;
        hosts[i].best_peer = names[j];
      }
    }
  }
  return hosts;
}

std::string fmt_link_rate(double bytes_per_sec) {
  const double bits = bytes_per_sec * 8;
  if (bits >= 1e9) return fmt_fixed(bits / 1e9, 2) + " Gbit/s";
  if (bits >= 1e6) return fmt_fixed(bits / 1e6, 1) + " Mbit/s";
  return fmt_fixed(bits / 1e3, 1) + " kbit/s";
}

std::vector<DoctorCheck> judge_links(const std::vector<HostLink>& hosts, const LinkOptions& opt) {
  std::vector<double> v;
  for (const HostLink& h : hosts) v.push_back(h.bytes_per_sec);
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  const double median = n == 0 ? 0 : n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
  const double floor_bytes = opt.min_gbps * 1e9 / 8;
  std::string limit = str("fails below ", fmt_fixed(opt.min_share, 2), "x the median");
  if (floor_bytes > 0) limit += str(" or below ", fmt_link_rate(floor_bytes));
  std::vector<DoctorCheck> checks;
  for (const HostLink& h : hosts) {
    const double share = median > 0 ? h.bytes_per_sec / median : 0;
    const bool slow = h.bytes_per_sec <= 0 || share < opt.min_share || h.bytes_per_sec < floor_bytes;
    std::string figure =
        h.bytes_per_sec > 0
            ? str(fmt_link_rate(h.bytes_per_sec), " (its best pair, with ", h.best_peer, "), ",
                  fmt_fixed(share, 2), "x the median ", fmt_link_rate(median))
            : std::string("no pair measured");
    checks.push_back({"link " + h.name, slow ? Verdict::fail : Verdict::ok, std::move(figure), limit});
  }
  return checks;
}

namespace {

// The number of timed repetitions after a first that took `first` seconds: as many as fit in
// pair_seconds, at most opt.reps in all.
int32_t more_reps(const LinkOptions& opt, double first) {
  const double fit = opt.pair_seconds / std::max(first, 1e-9);
  return int32_t(std::clamp(fit - 1, 0.0, double(opt.reps - 1)));
}

}  // namespace

LinkReport run_link_check(Communicator& comm, const LinkOptions& opt,
                          const std::function<void(const DoctorCheck&)>& out) {
  const int n = comm.size(), me = comm.rank();
  SPOTRAIN_CHECK(n >= 2, "the link check measures the links between the ranks of an MPI job: start it "
                 "under mpirun with one rank on each host, 2 hosts or more (e.g. mpirun --host A,B,C "
                 "--map-by ppr:1:node spotrain doctor --links)");
  SPOTRAIN_CHECK(opt.bytes >= 1024 && opt.allreduce_bytes >= 1024,
                 "the link check's messages must be 1 KiB or more");
  SPOTRAIN_CHECK(opt.reps >= 1, "the link check needs 1 or more repetitions, not ", opt.reps);
  SPOTRAIN_CHECK(opt.min_share >= 0 && opt.min_share <= 1, "--link-min-share must be 0 to 1, not ", opt.min_share);
  SPOTRAIN_CHECK(opt.names.empty() || int(opt.names.size()) == n, "--names gives ", opt.names.size(),
                 " names for ", n, " ranks; give one per rank, in rank order");
  const double t_start = now_seconds();
  const std::vector<std::string> names = opt.names.empty() ? gather_host_labels(comm) : opt.names;

  // Every pair, the pairs of a round at once; a barrier between rounds, so no pair's time
  // includes waiting for a partner still busy in the round before.
  std::vector<char> send(opt.bytes, '\x5a'), recv(opt.bytes);
  std::vector<float> rates(size_t(n) * size_t(n), 0.f);  // (n, n) bytes/s, row = the measuring rank
  for (const std::vector<int>& round : round_robin_rounds(n)) {
    comm.barrier();
    const int peer = round[size_t(me)];
    if (peer < 0) continue;
    char a = 1, b = 0;
    comm.exchange(peer, &a, &b, 1);  // both here; the connection made
    double t0 = now_seconds();
    comm.exchange(peer, send.data(), recv.data(), opt.bytes);
    double best = now_seconds() - t0;
    // The lower rank decides how many more the pair runs (both must run as many).
    int32_t mine = more_reps(opt, best), theirs = 0;
    comm.exchange(peer, &mine, &theirs, sizeof mine);
    const int32_t more = me < peer ? mine : theirs;
    for (int32_t i = 0; i < more; ++i) {
      t0 = now_seconds();
      comm.exchange(peer, send.data(), recv.data(), opt.bytes);
      best = std::min(best, now_seconds() - t0);
    }
    rates[size_t(me) * size_t(n) + size_t(peer)] = float(double(opt.bytes) / std::max(best, 1e-9));
  }
  comm.allreduce_sum(rates.data(), int64_t(rates.size()), DType::f32);

  // One all-reduce over every rank, timed as nccl-tests time it: the best of a few, each after a
  // barrier; rank 0 decides how many.
  std::vector<float> buf(opt.allreduce_bytes / sizeof(float), 0.f);  // zeros: the sums stay 0
  const int64_t count = int64_t(buf.size());
  comm.barrier();
  double t0 = now_seconds();
  comm.allreduce_sum(buf.data(), count, DType::f32);
  double best = now_seconds() - t0;
  int32_t more = more_reps(opt, best);
  comm.broadcast(&more, sizeof more, 0);
  for (int32_t i = 0; i < more; ++i) {
    comm.barrier();
    t0 = now_seconds();
    comm.allreduce_sum(buf.data(), count, DType::f32);
    best = std::min(best, now_seconds() - t0);
  }
  const double bytes = double(count) * sizeof(float);

  LinkReport rep;
  std::vector<std::vector<double>> matrix(size_t(n), std::vector<double>(size_t(n), 0.0));
  for (size_t i = 0; i < size_t(n); ++i)
    for (size_t j = 0; j < size_t(n); ++j) matrix[i][j] = rates[i * size_t(n) + j];
  rep.hosts = host_links(matrix, names);
  rep.allreduce_bus_bytes_per_sec = bytes / std::max(best, 1e-9) * 2.0 * (n - 1) / n;
  rep.checks = judge_links(rep.hosts, opt);
  rep.checks.push_back({str("allreduce ", n, " ranks"), Verdict::ok,
                        str(fmt_link_rate(rep.allreduce_bus_bytes_per_sec), " bus bandwidth (",
                            fmt_fixed(bytes / double(1 << 20), 1), " MiB of fp32 in ",
                            fmt_fixed(best * 1e3, 2), " ms, the best of ", more + 1, "; MPI, host memory)"),
                        "bus bandwidth as nccl-tests define it: size / time x 2(n-1)/n; no verdict"});
  rep.seconds = now_seconds() - t_start;
  if (me == 0 && out)
    for (const DoctorCheck& c : rep.checks) out(c);
  return rep;
}

}  // namespace spotrain::health
