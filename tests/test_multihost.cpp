// Spot jobs across hosts: two "hosts" made as network namespaces (tests/netns_hosts.sh), Open
// MPI across them over TCP, and the launcher examples/resnet50/launch/mpirun.sh with its
// restart loop, as a multi-node job runs. Real processes throughout:
//  - a preemption notice served on one host only stops every rank after the same step (75),
//    the launcher restarts the job, and it ends bit for bit where an uninterrupted run does;
//  - a link cut for good, and a host powered off, end the whole job with 76 within the bound
//    (--comm-timeout + 30 s), with no process left on any host; after the host returns the
//    restart resumes and finishes;
//  - on node-local disks (a disk per host), a host powered off with no checkpoint since the
//    start: the survivor saves the last finished step on its disk, the launcher restarts at
//    once on the host that remains (HOST_DISCOVERY), and when the host is back, with a new
//    empty disk, the job grows onto it at an agreed step and ends with a copy on both disks.
// Skipped, with the reason, where network namespaces cannot be made (not root, no
// CAP_NET_ADMIN, no iproute2). The measured times are printed for docs/MULTI_NODE.md.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <cstdio>
#include <iostream>
#include <regex>
#include <sstream>
#include <string>

#include "ckpt_state.h"
#include "run_command.h"
#include "text_search.h"

namespace fs = std::filesystem;

namespace {

const std::string kHosts = std::string(SPOTRAIN_SOURCE_DIR) + "/tests/netns_hosts.sh";

// A figure the scenario script printed as "NAME=VALUE" (-1 when missing).
double figure(const std::string& out, const std::string& name) {
  std::smatch m;
  if (!std::regex_search(out, m, std::regex(name + "=([0-9.]+)"))) return -1;
  return std::stod(m[1]);
}

class MultiHost : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string test = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    prefix_ = "st" + std::to_string(std::hash<std::string>()(test) % 100000);
    dir_ = fs::temp_directory_path() / ("spotrain_multihost_" + test);
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    CommandResult up = run_command(kHosts + " up " + prefix_ + " 2 " + disk());
    if (up.code == 77) GTEST_SKIP() << "network namespaces cannot be made here: " << up.out;
    ASSERT_EQ(up.code, 0) << up.out;
    std::istringstream lines(up.out);
    std::getline(lines, agent_);
    std::getline(lines, net_);
    std::ofstream(dir_ / "hosts") << net_ << ".1 slots=1\n" << net_ << ".2 slots=1\n";
    up_ = true;
  }
  void TearDown() override {
    if (up_) run_command(kHosts + " down " + prefix_);
  }
  // A path each host sees its own disk at ("" = none: one folder for all).
  virtual std::string disk() const { return ""; }

  // The launcher on the two hosts, one rank each (rank 0 on host 1, rank 1 on host 2), with
  // the environment `env` (MAX_RESTARTS, ...) and spotrain train arguments `args`. rtc ^hwloc:
  // Open MPI's daemons otherwise share a hwloc topology segment that namespaces break.
  // hostfile: the launcher's HOSTFILE argument ("" = the two hosts; "-" with HOST_DISCOVERY).
  std::string launcher(const std::string& env, const std::string& args, const std::string& hostfile = "") const {
    return "env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 " + env +
           " RANKS_PER_NODE=1 THREADS_PER_RANK=1 MPIRUN=" + MPIEXEC_EXECUTABLE + " SPOTRAIN=" +
           SPOTRAIN_BIN + " MPI_IFNAME=" + net_ + ".0/24 MPIRUN_ARGS='--mca plm_rsh_agent " +
           agent_ + " --mca rtc ^hwloc --mca btl tcp,self' " + SPOTRAIN_SOURCE_DIR +
           "/examples/resnet50/launch/mpirun.sh " +
           (hostfile.empty() ? (dir_ / "hosts").string() : hostfile) + " 2 " + args;
  }
  // Each step at least 0.05 s (SPOTRAIN_STEP_DELAY, passed to the ranks by the launcher's
  // EXTRA_ENV), for the environment of launcher(): what a scenario does on seeing a step line
  // then lands long before the run's end on a machine of any speed.
  static constexpr const char* kStepFloor = "SPOTRAIN_STEP_DELAY=0.05 EXTRA_ENV=SPOTRAIN_STEP_DELAY";

  std::string hosts(const std::string& what, int host) const {
    return kHosts + " " + what + " " + prefix_ + " " + std::to_string(host);
  }
  // Runs a scenario: `body` is shell that may use $log (the launcher's output so far),
  // `wait_for PATTERN` (until the log shows it; fails after 120 s or if the launcher ended),
  // `now` and `since T` (seconds from T, a `now`). The launcher runs in the background as $pid; the script waits for it, prints its
  // log and exits with its status.
  CommandResult scenario(const std::string& launch, const std::string& body) const {
    fs::path log = dir_ / "launch.log", script = dir_ / "scenario.sh";
    std::ofstream(script)
        << "log=" << log.string() << "\n"
        << "now() { date +%s.%N; }\n"
        << "since() { awk -v a=\"$(now)\" -v b=\"$1\" 'BEGIN { printf \"%.2f\", a - b }'; }\n"
        << "wait_for() {\n"
        << "  for i in $(seq 1 1200); do grep -qF -e \"$1\" $log && return 0;"
           " kill -0 $pid 2>/dev/null || break; sleep 0.1; done\n"
        << "  echo \"scenario: '$1' never came\"; return 1\n}\n"
        << "trap 'cat $log' EXIT\n"
        << "(" << launch << ") > $log 2>&1 &\npid=$!\n"
        << body << "\nwait $pid\n";
    return run_command("timeout -k 10 400 bash " + script.string() + " 2>&1");
  }

  // Loses host 2 at step 6 (`how`: cut or poweroff) of a 30-step run with --comm-timeout 5 (its
  // 24 steps left take 1.2 s or more: kStepFloor), and asserts what that must give: 76 within
  // the bound, nothing left running on either host, then (the host back) a restart that resumes
  // and finishes.
  void lose_host_2(const std::string& how) {
    const double comm_timeout = 5;
    const std::string args = train_args(dir_ / "run", "--steps 30 --ckpt-every 2 --comm-timeout 5");
    CommandResult r = scenario(launcher(std::string("MAX_RESTARTS=1 RESTART_DELAY=12 ") + kStepFloor, args),
                               "wait_for 'step 6/' || exit 1\nt0=$(now); " + hosts(how, 2) + "\n" +
                                   after_loss(2));
    EXPECT_EQ(r.code, 0) << r.out;
    EXPECT_TRUE(contains(r.out, "mpirun.sh: the job ended with 76; restart 1 of 1")) << r.out;
    double ended = figure(r.out, "ended_after"), cleared = figure(r.out, "cleared_after");
    ASSERT_GE(ended, 0) << r.out;
    EXPECT_LE(ended, comm_timeout + 30) << "the launcher returned too late:\n" << r.out;
    ASSERT_GE(cleared, 0) << "processes were left on a host:\n" << r.out;
    EXPECT_LE(cleared, comm_timeout + 30) << r.out;
    EXPECT_TRUE(std::regex_search(r.out, std::regex("resumed from .*ckpt-000000[0-9][0-9]\\.h5")))
        << r.out;
    EXPECT_TRUE(fs::exists(dir_ / "run" / "ckpt-00000030.h5")) << r.out;
    std::cout << "measured: host lost -> launcher returned " << ended
              << " s, every process gone " << cleared << " s (--comm-timeout " << comm_timeout
              << ")\n";
  }

  // Shell: after the launcher reports 76, wait (at most 10 s) until nothing runs on either
  // host, print when, then bring `host` back.
  std::string after_loss(int host) const {
    return "wait_for 'the job ended with 76' || exit 1\n"
           "echo ended_after=$(since $t0)\n"
           "for i in $(seq 1 100); do\n"
           "  left=\"$(" + hosts("pids", 1) + ")$(" + hosts("pids", 2) + ")\"\n"
           "  [ -z \"$left\" ] && { echo cleared_after=$(since $t0); break; }\n"
           "  sleep 0.1\ndone\n"
           "[ -z \"$left\" ] || echo \"left running: $left\"\n" +
           hosts("restore", host) + "\n";
  }

  // A tiny deterministic run: resnet20 on synthetic data, one compute thread per rank.
  static std::string train_args(const fs::path& ckpt, const std::string& more) {
    return "--model resnet20 --data synthetic --train-limit 4096 --test-limit 32 --batch-size 16"
           " --deterministic --log-every 1 --keep 100 --ckpt-dir " + ckpt.string() + " " + more;
  }

  std::string prefix_, agent_, net_;
  fs::path dir_;
  bool up_ = false;
};

TEST_F(MultiHost, ANoticeOnOneHostStopsEveryRankAndTheRestartEndsBitExact) {
  if (run_command("python3 -c 'import http.server'").code != 0)
    GTEST_SKIP() << "needs python3 for the notice's HTTP server";
  // The notice, as a cloud's metadata service gives it: an HTTP server on host 2's own
  // 127.0.0.1 (404 until the notice file exists); host 1 has none (a warning, no notice).
  const fs::path www = dir_ / "www";
  fs::create_directories(www);
  const std::string server = "ip netns exec " + prefix_ + "-2 python3 -m http.server 8808 --bind 127.0.0.1 --directory " +
                             www.string() + " > /dev/null 2>&1 &\nsrv=$!\n";
  // 48 steps of 0.05 s or more (kStepFloor): a notice polled every 0.2 s reaches the run some 5
  // steps after it was written, long before the last step on any machine (one seen only at the
  // last step ends the job as finished: 0, not 75).
  const std::string args = train_args(dir_ / "run", "--steps 48 --preempt-notice http://127.0.0.1:8808/notice --preempt-poll 0.2");
  CommandResult r = scenario(launcher(std::string("MAX_RESTARTS=1 RESTART_DELAY=2 ") + kStepFloor, args),
                             server +
                             "wait_for 'step 3/' || exit 1\n"
                             // Written whole, as a metadata service serves it (a poll may
                             // otherwise read the file between its creation and its text).
                             "t0=$(now); echo 'terminate' > " + (www / "notice.tmp").string() +
                             " && mv " + (www / "notice.tmp").string() + " " + (www / "notice").string() + "\n"
                             "wait_for 'the job ended with 75' || exit 1\n"
                             "echo notice_to_exit=$(since $t0)\n"
                             "rm " + (www / "notice").string() + "; kill $srv");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "preemption notice (notice at http://127.0.0.1:8808/notice: terminate)"))
      << r.out;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.out, m, std::regex("stopped by (a preemption notice.*|a stop request on another rank) after step (\\d+)")))
      << r.out;
  const int stopped = std::stoi(m[2]);
  ASSERT_LT(stopped, 48) << "the notice came only at the last step:\n" << r.out;
  char name[32];  // ckpt-%08d.h5: the stop may come at step 10 or later on a fast machine
  std::snprintf(name, sizeof name, "ckpt-%08d.h5", stopped);
  EXPECT_TRUE(contains(r.out, "resumed from " + (dir_ / "run" / name).string())) << r.out;
  // The ranks of a finished stop exit 0 under the launcher (which says 75 from rank 0's line):
  // a rank's 75 would make Open MPI hold mpirun 2 x SURVIVOR_WAIT (10 s) after they all ended.
  const double notice_to_exit = figure(r.out, "notice_to_exit");
  EXPECT_GE(notice_to_exit, 0) << r.out;
  EXPECT_LT(notice_to_exit, 6) << "the launcher returned long after the ranks ended:\n" << r.out;
  EXPECT_FALSE(contains(r.out, "returned\na non-zero exit code")) << r.out;
  std::cout << "measured: notice on one host -> every rank exited, launcher returned "
            << notice_to_exit << " s (stopped after step " << stopped << ")\n";

  // The same job uninterrupted ends on the same weights and momentum, bit for bit.
  CommandResult ref = run_command("timeout -k 10 300 " + launcher("", train_args(dir_ / "ref", "--steps 48")) + " 2>&1");
  ASSERT_EQ(ref.code, 0) << ref.out;
  expect_same_weights_and_momentum((dir_ / "ref" / "ckpt-00000048.h5").string(),
                                   (dir_ / "run" / "ckpt-00000048.h5").string());
}

// Plain `mpirun` across the two hosts with Open MPI's runtime keepalive at its default: rank 0
// says at start what a lost host would cost and what to set. With the keepalive set (as the
// project's launcher sets it) the run says nothing of it.
TEST_F(MultiHost, PlainMpirunWithTheDefaultKeepaliveIsToldAtStart) {
  auto plain_mpirun = [&](const std::string& more, const fs::path& ckpt) {
    return run_command("timeout -k 10 120 env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 " +
                       std::string(MPIEXEC_EXECUTABLE) + " --hostfile " + (dir_ / "hosts").string() +
                       " -np 2 --mca plm_rsh_agent " + agent_ + " --mca rtc ^hwloc --mca btl tcp,self" +
                       " --mca btl_tcp_if_include " + net_ + ".0/24 --mca oob_tcp_if_include " + net_ +
                       ".0/24 " + more + " " + SPOTRAIN_BIN + " train --threads 1 " +
                       train_args(ckpt, "--steps 2") + " 2>&1");
  };
  CommandResult bare = plain_mpirun("", dir_ / "bare");
  EXPECT_EQ(bare.code, 0) << bare.out;
  EXPECT_TRUE(contains(bare.out, "warning: Open MPI's runtime keepalive is at its default (300 s)")) << bare.out;
  EXPECT_TRUE(contains(bare.out, "--mca oob_tcp_keepalive_time 5")) << bare.out;
  CommandResult set = plain_mpirun("--mca oob_tcp_keepalive_time 5", dir_ / "set");
  EXPECT_EQ(set.code, 0) << set.out;
  EXPECT_FALSE(contains(set.out, "keepalive")) << set.out;
}

// A link cut for good at step 6: --comm-timeout (5 s) fires before Open MPI's own detection
// (mpirun.sh's OOB_KEEPALIVE, 5 + 2 x 3 s), the hardest order: the ranks leave the runtime its
// detection time before aborting, and the runtime ends the job on both hosts.
TEST_F(MultiHost, ALinkCutEndsTheJobWithinTheBoundAndTheRestartResumes) { lose_host_2("cut"); }

// A host powered off at step 6 (its link cut and everything on it killed, so no connection
// is reset): the launcher's side ends the job the same way.
TEST_F(MultiHost, AHostPoweredOffEndsTheJobWithinTheBoundAndTheRestartResumes) {
  lose_host_2("poweroff");
}

// HOST_DISCOVERY lists host 2 before its network is up (as an instance just started can be
// listed): the daemon started there cannot connect back, so mpirun cannot start the job
// ("unable to reliably start one or more daemons") and returns 1. The launcher counts that as
// a lost peer and starts again after RESTART_DELAY, once the host answers, on both hosts.
TEST_F(MultiHost, AHostListedBeforeItsNetworkIsUpCostsARestartNotTheJob) {
  const fs::path list = dir_ / "discover.sh";
  std::ofstream(list) << "echo " << net_ << ".1; echo " << net_ << ".2\n";
  ASSERT_EQ(run_command(hosts("cut", 2)).code, 0);
  const std::string env = "HOST_DISCOVERY='bash " + list.string() + "' DISCOVERY_INTERVAL=0 MAX_RESTARTS=1 RESTART_DELAY=2";
  CommandResult r = scenario(launcher(env, train_args(dir_ / "run", "--steps 6"), "-"),
                             "sleep 3\n" + hosts("restore", 2) + "\n");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "unable to reliably start one or more daemons")) << r.out;
  const size_t restart = r.out.find("mpirun.sh: the job could not start on every host listed (76); restart 1 of 1");
  ASSERT_NE(restart, std::string::npos) << r.out;
  EXPECT_TRUE(contains(r.out.substr(restart), "data parallel over 2 ranks")) << r.out;
  EXPECT_TRUE(fs::exists(dir_ / "run" / "ckpt-00000006.h5")) << r.out;
}

}  // namespace

namespace {

class MultiHostLocalDisks : public MultiHost {
 protected:
  std::string disk() const override { return (dir_ / "disk").string(); }
  fs::path disk_of(int host) const { return "/tmp/" + prefix_ + "-netns/disk-" + std::to_string(host); }
};

TEST_F(MultiHostLocalDisks, APoweredOffHostsSurvivorSavesTheJobGoesOnWithoutItAndGrowsBack) {
  const fs::path run = dir_ / "disk" / "run";
  const std::string env = "HOST_DISCOVERY='" + kHosts + " hosts " + prefix_ +
                          "' MIN_HOSTS=1 DISCOVERY_INTERVAL=1 MAX_RESTARTS=2 SURVIVOR_WAIT=3 " +
                          kStepFloor;  // the host must be back, and the job grown, before step 120
  CommandResult r = scenario(
      launcher(env, train_args(run, "--steps 120 --comm-timeout 60"), "-"),
      "wait_for 'step 6/' || exit 1\nt0=$(now); " + hosts("poweroff", 2) + "\n"
      "wait_for 'on the hosts up now' || exit 1\n"
      "echo restarted_after=$(since $t0)\n"
      "wait_for 'resumed from' || exit 1\n" +
          hosts("wipe", 2) + "\n" + hosts("restore", 2) + "\n"  // a new instance, a new disk
      "wait_for 'the job stopped to grow' || exit 1\n");
  EXPECT_EQ(r.code, 0) << r.out;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.out, m, std::regex("rank 0: saved the last step every rank finished, step (\\d+), to "
                                                     "(\\S+) in [0-9.]+ s \\(verified\\)"))) << r.out;
  const int64_t saved = std::stoll(m[1]);
  EXPECT_GE(saved, 5) << "the survivor saved an older step than the last it logged:\n" << r.out;
  EXPECT_TRUE(contains(r.out, "resumed from " + m[2].str() + ": step " + std::to_string(saved)))
      << "the restart on the host that remains did not take the survivor's save:\n" << r.out;
  EXPECT_TRUE(contains(r.out, "mpirun.sh: 1 rank(s) on 1 node(s)")) << r.out;
  EXPECT_TRUE(contains(r.out, "growing it to 2 rank(s) at an agreed step")) << r.out;
  const size_t grown = r.out.find("mpirun.sh: restart to grow:");
  ASSERT_NE(grown, std::string::npos) << r.out;
  const std::string after = r.out.substr(grown);
  EXPECT_TRUE(contains(after, "data parallel over 2 ranks")) << "the job did not grow back:\n" << after;
  EXPECT_TRUE(contains(after, "resumed from " + run.string())) << after;
  for (int host : {1, 2}) {
    const std::string last = (disk_of(host) / "run" / "ckpt-00000120.h5").string();
    EXPECT_EQ(run_command(std::string(SPOTRAIN_BIN) + " ckpt verify " + last).code, 0)
        << "host " << host << "'s disk lacks the final checkpoint";
  }
  std::cout << "measured: host powered off -> restart on the host that remains " << figure(r.out, "restarted_after")
            << " s\n";
}

}  // namespace
