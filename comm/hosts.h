// Host identity, in one place: the name of the machine a rank runs on as the launcher lists it,
// and every rank's, gathered once. The straggler lines, the leave rule, the rebalancer and the
// link check name hosts only through these, so one host is never named two ways.
#pragma once
#include <string>
#include <vector>

#include "comm/communicator.h"

namespace spotrain {

// "10.0.0.3" or "node07": this machine's name as the launcher lists it. mpirun.sh passes the
// hosts it launches on in SPOTRAIN_HOSTS (core/environment.h); the one that is this machine's
// name, its short name or one of its interface addresses is taken (hosts that share a name, as
// network namespaces do, differ by address). Else the machine's name.
std::string this_host_label();

// Every rank's host label (this_host_label(), 64 characters at most), by rank. Collective:
// every rank calls it at the same point; a few small all-gathers.
std::vector<std::string> gather_host_labels(Communicator& comm);

// Whether two names are one host's: the same, or the same short name ("node07" and
// "node07.cluster.local"; addresses are compared whole).
bool same_host(const std::string& a, const std::string& b);

// How many distinct hosts `labels` name.
int count_hosts(const std::vector<std::string>& labels);

}  // namespace spotrain
