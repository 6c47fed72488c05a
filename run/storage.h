// Where a run's checkpoints live: one folder every rank shares (network storage: rank 0 writes
// the one copy), or folders of their own (node-local disks: the lowest rank of each folder
// writes a copy there, so losing a host loses no checkpoint while another holds one). Found at
// start: every rank leaves a token in the folder it sees at --ckpt-dir and reads which tokens
// it sees; ranks that see the same ones share a folder.
#pragma once
#include <string>
#include <vector>

#include "engine/session.h"

namespace spotrain {

struct RunStorage {
  bool shared = true;        // one folder for all ranks
  std::vector<int> writers;  // the lowest rank of each folder, ascending (rank 0 first)
  bool writer = false;       // this rank writes its folder's copy
  // One line for the log: "shared by all 4 ranks (rank 0 writes)", "node-local: 2 folders, ...".
  std::string describe(int world) const;
};

// Every rank calls it (collective). mode: "auto" (found out), "shared" (rank 0 writes) or
// "node-local" (the first rank of each node writes). One rank: that rank writes. Throws on
// every rank when a rank cannot write a token into the folder it sees.
RunStorage find_storage(const std::string& dir, const std::string& mode, Session& session);

}  // namespace spotrain
