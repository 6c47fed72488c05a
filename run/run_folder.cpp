// RunFolder (see run_folder.h).
#include "run/run_folder.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "checkpoints/checkpoint.h"
#include "core/atomic_file.h"
#include "core/clock.h"
#include "core/error.h"
#include "core/log.h"
#include "core/environment.h"

namespace spotrain {

namespace fs = std::filesystem;

namespace {

nlohmann::json fingerprint_json(const nlohmann::json& cfg) {
  nlohmann::json f = nlohmann::json::object();
  for (const char* k : {"model", "data", "seed", "image_size", "train_limit"})
    if (cfg.contains(k)) f[k] = cfg[k];
  return f;
}

std::string read_file(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// A relative path made absolute, so that a restart from another directory finds it.
std::string absolute(const std::string& p) {
  if (p.empty() || fs::path(p).is_absolute()) return p;
  std::error_code ec;
  fs::path a = fs::absolute(p, ec);
  return ec ? p : a.lexically_normal().string();
}

// The settings as a [train] config file; resume is "auto", so that giving the file back
// with --config continues the run.
std::string settings_file(RunConfig cfg) {
  cfg.resume = "auto";
  cfg.new_run = false;
  cfg.ckpt_dir = absolute(cfg.ckpt_dir);
  if (cfg.metrics != "auto" && cfg.metrics != "none") cfg.metrics = absolute(cfg.metrics);
  cfg.plan = "";  // kept in the folder as plan.json
  const size_t colon = cfg.data.find(':');  // fashion-mnist:DIR, imagefolder:DIR, shards:DIR
  if (colon != std::string::npos)
    cfg.data = cfg.data.substr(0, colon + 1) + absolute(cfg.data.substr(colon + 1));
  return "# the settings of this run; restart it with: spotrain train --config FILE\n" + cfg.to_toml();
}

// The longest wait for the run folder's guard (RunFolder::lock): a live process holds it for
// microseconds.
constexpr double kGuardWaitSeconds = 10;

// An exclusive flock on `path` for as long as it lives, waited for up to kGuardWaitSeconds;
// without it (no locks on this filesystem, or a process stuck holding it) the caller goes on.
class Guard {
 public:
  explicit Guard(const std::string& path) : fd_(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644)) {
    const double deadline = now_seconds() + kGuardWaitSeconds;
    while (fd_ >= 0 && ::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      if ((err == EWOULDBLOCK || err == EINTR) && now_seconds() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
        continue;
      }
      if (err == EWOULDBLOCK)
        log_info(str("warning: ", path, " stayed locked for ", fmt_fixed(kGuardWaitSeconds, 0),
                     " s (a process stuck while taking the run folder); going on without it"));
      ::close(fd_);
      fd_ = -1;
    }
  }
  ~Guard() {
    if (fd_ >= 0) ::close(fd_);  // closing drops the flock
  }
  Guard(const Guard&) = delete;
  Guard& operator=(const Guard&) = delete;

 private:
  int fd_;
};

}  // namespace

std::string read_plan(const std::string& file) {
  SPOTRAIN_CHECK(fs::is_regular_file(file), "--plan ", file, " is not a file (write one with "
                 "`spotrain plan ... --json FILE`)");
  auto j = nlohmann::json::parse(read_file(file), nullptr, false);
  SPOTRAIN_CHECK(j.is_object() && j.contains("chosen") && j["chosen"].is_object(), "--plan ", file,
                 " holds no plan with a chosen offer (it is written by `spotrain plan ... --json FILE` "
                 "with an offer that meets the deadline or budget)");
  return j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

std::string run_fingerprint(const RunConfig& cfg) {
  return fingerprint_json(nlohmann::json::parse(cfg.to_json())).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

RunFolder::RunFolder(const RunConfig& cfg) : dir_(cfg.ckpt_dir) {
  SPOTRAIN_CHECK(!dir_.empty(), "internal: a run folder without a path");
  std::error_code ec;
  fs::create_directories(dir_, ec);
  SPOTRAIN_CHECK(!ec && fs::is_directory(dir_), "run folder ", dir_, " is not writable (",
                 ec ? ec.message() : std::string("not a directory"),
                 "); pass a writable --ckpt-dir");
  lock();
  claim(cfg);
  open_log();
}

RunFolder::~RunFolder() {
  if (log_) {
    log_file() = nullptr;
    std::fclose(log_);
  }
  if (lock_fd_ >= 0) ::close(lock_fd_);  // closing drops the flock
}

void RunFolder::open_log() {
  log_ = std::fopen(path("train.log").c_str(), "a");
  SPOTRAIN_CHECK(log_, "cannot write ", path("train.log"), ": ", std::strerror(errno));
  log_file() = log_;
  log_to_file(str("spotrain train, settings in ", path("config.toml")));
}

// The holder's record in .lock is written, and read by a refused process, only under a second
// lock, .lock.guard, taken before the folder's own: a holder takes the guard, then the folder's
// lock, writes its record and lets the guard go; a refused process reads the record under the
// guard. So a process that finds the folder held reads its live holder's whole record, never an
// empty file or the record a dead holder left (the lock and the record come as one).
void RunFolder::lock() {
  const std::string lock_path = path(".lock");
  Guard guard(lock_path + ".guard");
  lock_fd_ = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  SPOTRAIN_CHECK(lock_fd_ >= 0, "run folder ", dir_, " is not writable (", std::strerror(errno),
                 "); pass a writable --ckpt-dir");
  if (::flock(lock_fd_, LOCK_EX | LOCK_NB) != 0) {
    if (errno != EWOULDBLOCK) {  // a filesystem without locks (some Lustre/NFS mounts)
      log_info(str("warning: run folder ", dir_, " cannot be locked (", std::strerror(errno),
                   "): nothing stops a second process from using it"));
      return;
    }
    std::string holder = read_file(lock_path);
    while (!holder.empty() && (holder.back() == '\n' || holder.back() == ' ')) holder.pop_back();
    ::close(lock_fd_);
    lock_fd_ = -1;
    SPOTRAIN_THROW("run folder ", dir_, " is in use by another spotrain process (",
                   holder.empty() ? std::string("holder unknown") : holder + " as " + lock_path + " says",
                   "); wait for it to end, stop it, or pass another --ckpt-dir");
  }
  if (test_hooks().run_lock_delay > 0) {  // the moment between the lock and the record, held open
    std::fprintf(stderr, "SPOTRAIN_RUN_LOCK_DELAY: pid %d holds %s, its record in %g s\n", int(::getpid()),
                 lock_path.c_str(), test_hooks().run_lock_delay);
    std::fflush(stderr);
    std::this_thread::sleep_for(std::chrono::duration<double>(test_hooks().run_lock_delay));
  }
  std::string me = str("pid ", ::getpid(), " on ", host_name(), ", since ", utc_time_iso(), "\n");
  if (::ftruncate(lock_fd_, 0) == 0 && ::pwrite(lock_fd_, me.data(), me.size(), 0) < 0) {
    // the lock holds without the note; only the message to a second process is poorer
  }
}

void RunFolder::move_aside() {
  std::string stamp = utc_time_iso();
  for (char& c : stamp)
    if (c == ':') c = '-';
  const fs::path to = fs::path(dir_) / ("previous-" + stamp);
  std::error_code ec;
  fs::create_directories(to, ec);
  SPOTRAIN_CHECK(!ec, "cannot create ", to.string(), ": ", ec.message());
  int moved = 0;
  for (auto& e : fs::directory_iterator(dir_, ec)) {
    const std::string n = e.path().filename().string();
    const bool ours = n.rfind("ckpt-", 0) == 0 || n == "latest" || n == "run.json" ||
                      n == "config.toml" || n == "metrics.jsonl" || n == "train.log" || n == "plan.json" ||
                      n == "classes.txt";
    if (!ours) continue;
    fs::rename(e.path(), to / n, ec);
    SPOTRAIN_CHECK(!ec, "cannot move ", e.path().string(), " to ", to.string(), ": ", ec.message());
    ++moved;
  }
  log_info(str("--new-run: moved the previous run's ", moved, " file(s) to ", to.string()));
}

void RunFolder::claim(const RunConfig& cfg) {
  const std::string mine = run_fingerprint(cfg);
  const std::vector<std::string> ckpts = list_checkpoints(dir_);
  // The run the folder holds: its run.json, else (folders written before run.json) the
  // settings saved in its newest readable checkpoint.
  std::string theirs, theirs_from;  // and the file it was read from
  if (fs::exists(path("run.json"))) {
    auto j = nlohmann::json::parse(read_file(path("run.json")), nullptr, false);
    if (j.is_object() && j.contains("fingerprint")) {
      theirs = j["fingerprint"].dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
      theirs_from = path("run.json");
    }
  }
  for (size_t i = 0; theirs.empty() && i < ckpts.size(); ++i) {
    try {
      auto j = nlohmann::json::parse(read_checkpoint_info(ckpts[i]).config_json, nullptr, false);
      if (j.is_object()) {
        theirs = fingerprint_json(j).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
        theirs_from = ckpts[i] + "'s run config";
      }
    } catch (const std::exception&) {
    }
  }
  if (cfg.new_run && (!ckpts.empty() || !theirs.empty())) {
    move_aside();
    theirs.clear();
  } else if (ckpts.empty() && !theirs.empty() && theirs != mine) {
    // Another run's folder without a checkpoint yet (it died before its first): its metrics
    // and log are not ours to append to.
    SPOTRAIN_THROW("run folder ", dir_, " belongs to another run (", theirs_from, ": ", theirs,
                   "): start a new run in it with --new-run (its files move to ", dir_,
                   "/previous-<time>/), or pass another --ckpt-dir");
  } else if (!ckpts.empty()) {
    const std::string newest = fs::path(ckpts.front()).filename().string();
    SPOTRAIN_CHECK(cfg.resume != "none", "run folder ", dir_, " holds another run's checkpoints (",
                   ckpts.size(), ", newest ", newest, "): continue that run with --resume auto, "
                   "start a new one in it with --new-run (its files move to ", dir_,
                   "/previous-<time>/), or pass another --ckpt-dir");
    if (!theirs.empty() && theirs != mine) {
      auto a = nlohmann::json::parse(theirs), b = nlohmann::json::parse(mine);
      std::string diff;
      for (auto it = b.begin(); it != b.end(); ++it) {
        if (a.contains(it.key()) && a[it.key()] == it.value()) continue;
        std::string flag = "--" + it.key();
        std::replace(flag.begin(), flag.end(), '_', '-');
        diff += str(diff.empty() ? "" : ", ", flag, " ",
                      a.contains(it.key()) ? a[it.key()].dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) : std::string("(unset)"), " there, ",
                    it.value().dump(-1, ' ', false, nlohmann::json::error_handler_t::replace), " here");
      }
      SPOTRAIN_THROW("run folder ", dir_, " holds a different run (", diff, "; 'there' as ",
                     theirs_from, " records it): resume it with its own settings (", dir_,
                     "/config.toml), start a new run with --new-run, or pass another --ckpt-dir");
    }
  }
  if (theirs.empty() || theirs != mine) {
    nlohmann::json j{{"fingerprint", nlohmann::json::parse(mine)}, {"created", utc_time_iso()}};
    write_file_atomic(path("run.json"), j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n", "the run's fingerprint");
  }
  write_file_atomic(path("config.toml"), settings_file(cfg), "the run's settings");
  if (!cfg.plan.empty())  // the plan this run follows, for `report` to set beside it
    write_file_atomic(path("plan.json"), read_plan(cfg.plan), "the run's plan");
}

}  // namespace spotrain
