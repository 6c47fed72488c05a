// Preemption notices: a cloud says minutes ahead that it will reclaim a spot instance (AWS:
// the spot instance-action, two minutes ahead; GCP: the preempted flag, ~30 s; Azure: a
// Preempt scheduled event, ~30 s). A watcher thread polls the instance-metadata service and,
// when a notice appears, asks for the same agreed stop a SIGTERM gives (request_stop): every
// rank stops after the same step with a verified checkpoint and exit 75, before the SIGTERM
// (and the kill that follows) arrive. Sources (--preempt-notice):
//   aws | gcp | azure   the cloud's metadata service (IMDSv2 token on AWS)
//   http://HOST/PATH    a notice is an HTTP 200 answer (404 or no answer: none)
//   file:PATH           a notice is the file existing
// HTTP goes through libcurl; a build without it accepts only file: sources.
#pragma once
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

namespace spotrain {

// Checks `source` once: "" when there is no notice, else what the notice says. `error`
// receives why the source could not be read ("" when it could).
std::string check_preempt_notice(const std::string& source, std::string* error = nullptr);

// Throws Error for a source that is not one of the forms above (or needs libcurl without it).
void validate_preempt_notice(const std::string& source);

class PreemptionWatcher {
 public:
  PreemptionWatcher(const std::string& source, double poll_seconds);
  ~PreemptionWatcher();
  PreemptionWatcher(const PreemptionWatcher&) = delete;
  PreemptionWatcher& operator=(const PreemptionWatcher&) = delete;

 private:
  void loop();
  std::string source_;
  double poll_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool quit_ = false;
  std::thread thread_;
};

}  // namespace spotrain
