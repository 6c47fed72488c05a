// write_file_atomic, commit_file and FileLock (see atomic_file.h).
#include "core/atomic_file.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "core/error.h"
#include "core/log.h"

namespace spotrain {

namespace {

std::string folder_of(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

// Writes all of `data` to `fd`; false with errno set on a failure (a full disk: ENOSPC).
bool write_all(int fd, const char* data, size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(fd, data, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    data += w;
    n -= size_t(w);
  }
  return true;
}

}  // namespace

void fsync_path(const std::string& path, bool is_dir) {
  const int fd = ::open(path.c_str(), is_dir ? O_RDONLY | O_DIRECTORY : O_RDONLY);
  if (fd < 0) SPOTRAIN_THROW("cannot open ", path, " to sync it: ", std::strerror(errno));
  const int r = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (r != 0) SPOTRAIN_THROW("fsync of ", path, " failed: ", std::strerror(err));
}

std::string temp_path_for(const std::string& path) {
  static std::atomic<uint64_t> next{0};
  // The host too: ranks on several hosts writing one file on shared storage may have the same
  // process id (containers number their processes alike).
  return path + "." + host_name() + "-" + std::to_string(::getpid()) + "-" + std::to_string(next++) + ".tmp";
}

void write_file_atomic(const std::string& path, const std::string& contents, const std::string& what,
                       Durability d) {
  const std::string tmp = temp_path_for(path);
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) SPOTRAIN_THROW("cannot write ", what, " ", tmp, ": ", std::strerror(errno));
  bool ok = write_all(fd, contents.data(), contents.size());
  if (ok && d == Durability::synced) ok = ::fsync(fd) == 0;
  const int err = errno;
  if (::close(fd) != 0) ok = false;
  if (!ok) {
    std::remove(tmp.c_str());
    SPOTRAIN_THROW("cannot write ", what, " ", tmp, ": ", std::strerror(err));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int rerr = errno;
    std::remove(tmp.c_str());
    SPOTRAIN_THROW("cannot replace ", what, " ", path, ": ", std::strerror(rerr));
  }
  if (d == Durability::synced) fsync_path(folder_of(path), true);
}

FileLock::FileLock(const std::string& path)
    : fd_(::open((path + ".lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644)) {
  if (fd_ >= 0) {
    while (::flock(fd_, LOCK_EX) != 0 && errno == EINTR) {
    }
  }
}

FileLock::~FileLock() {
  if (fd_ >= 0) ::close(fd_);
}

void commit_file(const std::string& tmp, const std::string& path, const std::string& what) {
  try {
    fsync_path(tmp, false);
  } catch (...) {
    std::remove(tmp.c_str());
    throw;
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    SPOTRAIN_THROW("cannot rename ", what, " ", tmp, " to ", path, ": ", std::strerror(err));
  }
  fsync_path(folder_of(path), true);
}

std::optional<std::string> read_file_if_any(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return std::nullopt;
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  SPOTRAIN_CHECK(in && !in.bad(), "cannot be read");
  return text.str();
}

}  // namespace spotrain
