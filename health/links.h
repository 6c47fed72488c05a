// The link check (`spotrain doctor --links`, under mpirun with one rank per host): how fast each
// host's network link carries data to the others, held against the median host, and the bus
// bandwidth of one all-reduce over all of them. Every pair of hosts is measured point to point
// (round-robin rounds, the pairs of a round at once); a host's figure is the best of its pairs,
// so one slow host does not drag the others down. MPI over host buffers: a GPU rank's NCCL path
// is not what this measures.
#pragma once
#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "health/doctor.h"

namespace spotrain {
class Communicator;
}

namespace spotrain::health {

struct LinkOptions {
  size_t bytes = size_t(4) << 20;            // one exchange, each way
  int reps = 10;                             // timed exchanges of a pair or all-reduces, at most: the
  double pair_seconds = 1.0;                 // best of as many as fit in this (at least one)
  size_t allreduce_bytes = size_t(4) << 20;  // the all-reduce's buffer (fp32)
  double min_share = 0.5;                    // a host fails below this share of the median figure
  double min_gbps = 0;                       // ... or below this many Gbit/s (0: no floor)
  std::vector<std::string> names;            // one per rank; empty: each rank's host name
};

// The rounds of a round-robin tournament over n ranks: round k holds each rank's partner (-1:
// none that round, when n is odd). Every pair meets exactly once: n-1 rounds (n when n is odd).
std::vector<std::vector<int>> round_robin_rounds(int n);

struct HostLink {
  std::string name;
  double bytes_per_sec = 0;  // the best of its pairs (0: none measured)
  std::string best_peer;     // the host of that pair
};

// Each host's figure from rates[i][j], bytes/s between ranks i and j as rank i measured it (a
// pair's figure is the lower of its two sides'; 0 = not measured).
std::vector<HostLink> host_links(const std::vector<std::vector<double>>& rates,
                                 const std::vector<std::string>& names);

// One check per host, named "link NAME": fail below min_share x the median of the hosts'
// figures, or below min_gbps. With two hosts both have the same figure (their one pair), so only
// the floor can tell them apart.
std::vector<DoctorCheck> judge_links(const std::vector<HostLink>& hosts, const LinkOptions& opt);

struct LinkReport {
  std::vector<HostLink> hosts;
  double allreduce_bus_bytes_per_sec = 0;  // nccl-tests' bus bandwidth: size / time x 2(n-1)/n
  double seconds = 0;                      // the whole check
  std::vector<DoctorCheck> checks;         // one per host, then the all-reduce's
};

// Runs on every rank of `comm` (each call collective); the report is rank 0's, which alone hands
// its checks to `out`. Throws Error for bad options or a failed MPI call.
LinkReport run_link_check(Communicator& comm, const LinkOptions& opt,
                          const std::function<void(const DoctorCheck&)>& out);

// "8.21 Gbit/s", "19.6 Mbit/s": a rate in bytes/s, as network links are quoted.
std::string fmt_link_rate(double bytes_per_sec);

}  // namespace spotrain::health
