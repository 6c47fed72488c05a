// Host identity (see hosts.h).
#include "comm/hosts.h"

#include <ifaddrs.h>
#include <netdb.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <set>

#include "core/environment.h"
#include "core/log.h"

namespace spotrain {

namespace {

// This machine's interface addresses, as text ("10.0.0.3", "fe80::1").
std::vector<std::string> own_addresses() {
  std::vector<std::string> out;
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return out;
  for (ifaddrs* a = list; a; a = a->ifa_next) {
    if (!a->ifa_addr) continue;
    const int family = a->ifa_addr->sa_family;
    if (family != AF_INET && family != AF_INET6) continue;
    char host[NI_MAXHOST];
    const socklen_t len = family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
    if (::getnameinfo(a->ifa_addr, len, host, sizeof host, nullptr, 0, NI_NUMERICHOST) == 0)
      out.push_back(host);
  }
  ::freeifaddrs(list);
  return out;
}

std::string short_name(const std::string& name) { return name.substr(0, name.find('.')); }

bool numeric(const std::string& name) { return name.find_first_not_of("0123456789.:abcdefABCDEF") == std::string::npos; }

}  // namespace

std::string this_host_label() {
  const std::string me = host_name();
  const std::vector<std::string>& hosts = launcher_settings().hosts;
  if (hosts.empty()) return me;
  for (const std::string& h : hosts)
    if (same_host(h, me)) return h;
  const std::vector<std::string> mine = own_addresses();
  for (const std::string& h : hosts)
    if (std::find(mine.begin(), mine.end(), h) != mine.end()) return h;
  return me;
}

std::vector<std::string> gather_host_labels(Communicator& comm) {
  char mine[64] = {0};
  const std::string h = this_host_label();
  std::memcpy(mine, h.data(), std::min(h.size(), sizeof mine - 1));
  if (comm.size() == 1) return {mine};
  // 8 bytes of each rank's label at a time.
  std::vector<std::string> labels(size_t(comm.size()));
  for (size_t off = 0; off < sizeof mine; off += 8) {
    uint64_t v = 0;
    std::memcpy(&v, mine + off, 8);
    const std::vector<uint64_t> all = comm.allgather(v);
    for (size_t r = 0; r < labels.size() && r < all.size(); ++r)
      labels[r].append(reinterpret_cast<const char*>(&all[r]), 8);
  }
  for (std::string& s : labels) s = s.substr(0, s.find('\0'));
  return labels;
}

bool same_host(const std::string& a, const std::string& b) {
  return a == b || (!numeric(a) && !numeric(b) && short_name(a) == short_name(b));
}

int count_hosts(const std::vector<std::string>& labels) {
  return int(std::set<std::string>(labels.begin(), labels.end()).size());
}

}  // namespace spotrain
