// find_storage (see storage.h).
#include "run/storage.h"

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>

#include "core/error.h"

namespace spotrain {

namespace fs = std::filesystem;

std::string RunStorage::describe(int world) const {
  if (shared) return str("shared by all ", world, world == 1 ? " rank" : " ranks", " (rank 0 writes the checkpoints)");
  std::string ranks;
  for (size_t i = 0; i < writers.size(); ++i) ranks += str(i ? ", " : "", writers[i]);
  return str("not shared: ", writers.size(), " separate folders (node-local disks); ranks ", ranks,
             " each keep a copy of every checkpoint in theirs");
}

RunStorage find_storage(const std::string& dir, const std::string& mode, Session& session) {
  RunStorage st;
  const int world = session.world(), rank = session.rank();
  if (world == 1 || mode == "shared") {
    st.writers = {0};
    st.writer = rank == 0;
    return st;
  }
  if (mode == "node-local") {  // the first rank of each node
    std::vector<uint64_t> local;
    session.worker().run("all-gather of the local ranks", [&] { local = session.comm().allgather(uint64_t(session.comm().local_rank())); });
    for (size_t r = 0; r < local.size(); ++r)
      if (local[r] == 0) st.writers.push_back(int(r));
    st.shared = false;
    st.writer = session.comm().local_rank() == 0;
    return st;
  }
  uint64_t nonce = 0;
  if (rank == 0) nonce = (uint64_t(std::random_device{}()) << 32) ^ std::random_device{}() ^ uint64_t(::time(nullptr));
  session.worker().run("broadcast of the run folder's token", [&] { session.comm().broadcast(&nonce, sizeof nonce, 0); });
  const std::string prefix = str(".storage-", std::hex, nonce, "-");
  const std::string mine = str(dir, "/", prefix, std::dec, rank);
  std::error_code ec;
  fs::create_directories(dir, ec);
  std::string error;
  if (!std::ofstream(mine)) error = str("cannot write into ", dir, " (", ec ? ec.message() : std::string("not writable"), ")");
  session.worker().run("barrier after the run folder's tokens", [&] { session.comm().barrier(); });
  // The lowest rank whose token this rank sees: the writer of its folder (-1: a failure).
  int64_t lowest = -1;
  if (error.empty()) {
    // Never a throw between the barrier and the all-gather: the other ranks would wait on us.
    for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
      const std::string n = it->path().filename().string();
      if (n.rfind(prefix, 0) != 0) continue;
      const int64_t r = std::atoll(n.c_str() + prefix.size());
      if (lowest < 0 || r < lowest) lowest = r;
    }
    if (lowest < 0) error = str("cannot read back its own token in ", dir);
  }
  std::vector<uint64_t> all;
  session.worker().run("all-gather of the run folder's writers", [&] { all = session.comm().allgather(uint64_t(lowest + 1)); });
  fs::remove(mine, ec);
  if (!error.empty()) SPOTRAIN_THROW("--ckpt-dir ", dir, ": rank ", rank, " ", error, "; pass a folder every rank can write");
  for (size_t r = 0; r < all.size(); ++r)
    SPOTRAIN_CHECK(all[r] > 0, "--ckpt-dir ", dir, ": rank ", r, " cannot write into the folder it sees there (see its error)");
  std::set<int> writers;
  for (uint64_t w : all) writers.insert(int(w) - 1);
  st.writers.assign(writers.begin(), writers.end());
  st.shared = st.writers.size() == 1 && st.writers[0] == 0;
  st.writer = int(all[size_t(rank)]) - 1 == rank;
  return st;
}

}  // namespace spotrain
