// Files replaced whole or not at all: written to a temporary beside PATH, flushed and fsynced,
// renamed over PATH, then the folder fsynced. A crash, a kill or a full disk leaves the old
// file or the new one, never half of one; a failure removes the temporary and names the cause.
// Every writer of a file that someone else reads (checkpoints, `latest`, the run folder's
// settings, shards' index, Prometheus, reports, eval --json) goes through here.
#pragma once
#include <optional>
#include <string>

namespace spotrain {

enum class Durability {
  synced,   // fsync the file and the folder: the new contents survive a power loss
  visible,  // rename only: readers never see half a file; a crash may keep the old one
};

// Replaces `path` with `contents`. `what` names the file in errors ("the --prometheus file").
void write_file_atomic(const std::string& path, const std::string& contents, const std::string& what,
                       Durability d = Durability::synced);

// For a file another library writes (HDF5): the caller wrote `tmp` in `path`'s folder and closed
// it; this fsyncs it, renames it to `path` and fsyncs the folder. On failure `tmp` is removed.
void commit_file(const std::string& tmp, const std::string& path, const std::string& what);

// A temporary name for `path` no other write uses, "PATH.<host>-<pid>-<n>.tmp": two processes
// (or threads, or hosts) replacing one file at once (several writers of a shared `latest`)
// never write into each other's temporary; the last rename wins whole.
std::string temp_path_for(const std::string& path);

// fsync of a file, or of a folder (its entries: a rename made durable).
void fsync_path(const std::string& path, bool is_dir);

// The whole of a file such a writer replaces, or nullopt where it does not exist; throws Error
// ("cannot be read") where it exists but cannot be read.
std::optional<std::string> read_file_if_any(const std::string& path);

// An exclusive lock on "PATH.lock" (flock) while alive, for writers that read a shared file,
// merge their part into it and replace it whole (the kernel cache, the fast paths' verdicts):
// the ranks writing one file (a node's, or every node's on shared storage) merge in turn
// instead of one write replacing what another just merged. Where no lock can be had (a
// filesystem without them) the writes still replace the file whole; a writer's new part may
// then be lost, never the file.
class FileLock {
 public:
  explicit FileLock(const std::string& path);
  ~FileLock();  // releases the lock
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;

 private:
  int fd_;
};

}  // namespace spotrain
