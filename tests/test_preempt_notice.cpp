// Preemption notices: a notice served over HTTP on 127.0.0.1 (as a cloud's metadata service
// would serve it) stops a running job after the step under way with a verified checkpoint and
// exit 75, recorded in the metrics with the notice; a file: notice does the same; an
// unreachable source is reported once and training goes on; a malformed source is refused.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>

#include "run_command.h"

namespace fs = std::filesystem;

namespace {

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

std::string train(const fs::path& dir, const std::string& more) {
  return std::string(SPOTRAIN_BIN) +
         " train --model resnet20 --data synthetic --train-limit 1024 --test-limit 32 "
         "--batch-size 16 --threads 1 --log-every 1 --ckpt-dir " + dir.string() + " " +
         more;
}

// Runs `launch` in the background, waits for "step 3/" in its log, then runs `notice`, and
// waits for the run. Output: the run's log; code: its exit code.
CommandResult notice_after_step_3(const fs::path& d, const std::string& launch,
                                  const std::string& notice) {
  fs::path log = d / "train.out", script = d / "run.sh";
  std::ofstream(script) << "(" << launch << ") > " << log.string() << " 2>&1 &\n"
                        << "pid=$!\n"
                        << "while ! grep -q 'step 3/' " << log.string()
                        << " && kill -0 $pid 2>/dev/null; do sleep 0.05; done\n"
                        << notice << "\n"
                        << "date +%s.%N > " << (d / "notice.time").string() << "\n"
                        << "wait $pid\nrc=$?\ncat " << log.string() << "\nexit $rc\n";
  return run_command("timeout -k 5 120 sh " + script.string());
}

bool have_python() { return run_command("/usr/bin/python3 -c 'import http.server'").code == 0; }

}  // namespace

TEST(PreemptNotice, AnHttpNoticeStopsTheRunWithACheckpoint) {
  if (!have_python()) GTEST_SKIP() << "needs /usr/bin/python3 for the local HTTP server";
  fs::path d = fs::temp_directory_path() / "spotrain_notice_http";
  fs::remove_all(d);
  fs::create_directories(d / "www");
  // A local HTTP server on a free port: /notice is 404 until the notice file is written.
  CommandResult port = run_command(
      "/usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind((\"127.0.0.1\", 0)); "
      "print(s.getsockname()[1])'");
  ASSERT_EQ(port.code, 0) << port.out;
  const std::string p = port.out.substr(0, port.out.find('\n'));
  const std::string url = "http://127.0.0.1:" + p + "/notice";
  const std::string server = "/usr/bin/python3 -m http.server " + p + " --bind 127.0.0.1 --directory " +
                             (d / "www").string();
  CommandResult r = notice_after_step_3(
      d, "(" + server + " > /dev/null 2>&1 & srv=$!; " +
             train(d / "run", "--steps 400 --preempt-notice " + url + " --preempt-poll 0.1") +
             "; rc=$?; kill $srv; exit $rc)",
      // A notice with a 2 MB body (written whole): only an excerpt reaches the log.
      "(echo '{\"action\": \"terminate\", \"time\": \"2026-12-01T00:02:00Z\"}'; head -c 2000000 /dev/zero | tr '\\0' x) > " +
          (d / "www" / "notice.tmp").string() + " && mv " + (d / "www" / "notice.tmp").string() + " " +
          (d / "www" / "notice").string());
  ASSERT_EQ(r.code, 75) << r.out.substr(0, 20000);
  EXPECT_LT(r.out.size(), 100000u) << "the notice's body was echoed whole";
  EXPECT_TRUE(contains(r.out, "+ bytes)")) << r.out;
  EXPECT_TRUE(contains(r.out, "watching for preemption notices: " + url)) << r.out;
  EXPECT_TRUE(contains(r.out, "preemption notice (notice at " + url)) << r.out;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.out, m, std::regex("stopped by a preemption notice .* after step (\\d+)")))
      << r.out;
  const int step = std::stoi(m[1]);
  EXPECT_GE(step, 3);
  EXPECT_LT(step, 40) << "the notice was seen late:\n" << r.out;
  char name[32];
  std::snprintf(name, sizeof name, "ckpt-%08d.h5", step);
  EXPECT_EQ(run_command(std::string(SPOTRAIN_BIN) + " ckpt verify " + (d / "run" / name).string()).code, 0);
  std::ifstream metrics(d / "run" / "metrics.jsonl");
  std::string line, stop;
  while (std::getline(metrics, line))
    if (contains(line, "\"type\":\"stop\"")) stop = line;
  EXPECT_TRUE(contains(stop, "a preemption notice (notice at " + url)) << stop;
}

TEST(PreemptNotice, AFileNoticeStopsTheRunAndAnUnreachableSourceIsOnlyReported) {
  fs::path d = fs::temp_directory_path() / "spotrain_notice_file";
  fs::remove_all(d);
  fs::create_directories(d);
  CommandResult r = notice_after_step_3(
      d, train(d / "run", "--steps 400 --preempt-notice file:" + (d / "notice").string() +
                           " --preempt-poll 0.1"),
      "echo reclaim > " + (d / "notice").string());
  ASSERT_EQ(r.code, 75) << r.out;
  EXPECT_TRUE(contains(r.out, "stopped by a preemption notice (file " + (d / "notice").string() +
                                  ": reclaim)"))
      << r.out;
  // Nothing listens on port 9: one warning, and the run goes on to its end.
  CommandResult u = run_command(train(d / "run2", "--steps 3 --preempt-notice http://127.0.0.1:9/x "
                                                  "--preempt-poll 0.05"));
  EXPECT_EQ(u.code, 0) << u.out;
  EXPECT_TRUE(contains(u.out, "step 3/3")) << "the run did not train to its end:\n" << u.out;
  EXPECT_TRUE(contains(u.out, "warning: --preempt-notice http://127.0.0.1:9/x cannot be read")) << u.out;
  size_t first = u.out.find("cannot be read");
  EXPECT_EQ(u.out.find("cannot be read", first + 1), std::string::npos) << "warned more than once";
  // A notice already up when the run starts (a restart on a node about to go): 75 at once.
  CommandResult up = run_command(train(d / "run4", "--steps 100 --preempt-notice file:" +
                                                       (d / "notice").string()));
  EXPECT_EQ(up.code, 75) << up.out;
  EXPECT_TRUE(contains(up.out, "already up: not starting")) << up.out;
  EXPECT_FALSE(contains(up.out, "step 1/")) << up.out;
  CommandResult bad = run_command(train(d / "run3", "--steps 1 --preempt-notice ibm"));
  EXPECT_EQ(bad.code, 1) << bad.out;
  EXPECT_TRUE(contains(bad.out, "unknown --preempt-notice 'ibm'")) << bad.out;
}

// SPOTRAIN_STOP_EXIT_CODE (core/exit_codes.h, set by mpirun.sh): a finished stop exits with
// the code asked for and still says so on its last line; a notice already up at start (nothing
// trained, nothing saved) keeps 75; a value that is no exit code is refused before training.
TEST(PreemptNotice, ALauncherThatReadsTheStopLineGetsTheExitCodeItAskedFor) {
  fs::path d = fs::temp_directory_path() / "spotrain_notice_exit_code";
  fs::remove_all(d);
  fs::create_directories(d);
  const std::string notice = (d / "notice").string();
  CommandResult r = notice_after_step_3(
      d, "SPOTRAIN_STOP_EXIT_CODE=0 " + train(d / "run", "--steps 400 --preempt-notice file:" + notice +
                                                             " --preempt-poll 0.1"),
      "echo reclaim > " + notice);
  EXPECT_EQ(r.code, 0) << r.out;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.out, m, std::regex("stopped by a preemption notice .* after step (\\d+); "
                                                     "resume with --resume auto")))
      << r.out;
  char name[32];
  std::snprintf(name, sizeof name, "ckpt-%08d.h5", std::stoi(m[1]));
  EXPECT_TRUE(fs::exists(d / "run" / name)) << r.out;
  CommandResult up = run_command("SPOTRAIN_STOP_EXIT_CODE=0 " +
                                 train(d / "run2", "--steps 100 --preempt-notice file:" + notice));
  EXPECT_EQ(up.code, 75) << up.out;
  CommandResult bad = run_command("SPOTRAIN_STOP_EXIT_CODE=75x " + train(d / "run3", "--steps 1"));
  EXPECT_EQ(bad.code, 1) << bad.out;
  EXPECT_TRUE(contains(bad.out, "error: SPOTRAIN_STOP_EXIT_CODE='75x' is not an exit code (0-255)")) << bad.out;
  EXPECT_FALSE(contains(bad.out, "step 1/")) << bad.out;
}
