// The health gate at launch (examples/resnet50/launch/health_gate.sh, run by mpirun.sh with
// HEALTH_CHECK=1) on three "hosts" made as network namespaces (tests/netns_hosts.sh), Open MPI
// across them over TCP, real processes throughout:
//  - host 3's link rate-limited to 20 Mbit/s (tc's token bucket) and host 2's doctor broken (the
//    gate's test hook, HEALTH_TEST_BREAK_HOST: a planted wrong op): both are left out, each named
//    with its reason, and the job trains on host 1 (MIN_HOSTS=1) to its end;
//  - with HOST_DISCOVERY, a host left out is not grown onto as soon as the poller sees it;
//  - the broken host alone: fewer than MIN_HOSTS pass, the launcher exits 1 with the gate's one
//    error line and starts no rank;
//  - `spotrain doctor --links` on one machine (three ranks, no namespaces): a line per host and
//    the all-reduce, the JSON the same.
// The namespace tests are skipped, with the reason, where namespaces cannot be made (not root,
// no CAP_NET_ADMIN, no iproute2) or `tc` is missing. The gate's time is printed.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>

#include "run_command.h"
#include "text_search.h"

namespace fs = std::filesystem;

namespace {

const std::string kHosts = std::string(SPOTRAIN_SOURCE_DIR) + "/tests/netns_hosts.sh";
const std::string kRoot = "env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 ";

class HealthGate : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string test = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    prefix_ = "hg" + std::to_string(std::hash<std::string>()(test) % 100000);
    dir_ = fs::temp_directory_path() / ("spotrain_health_gate_" + test);
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    if (run_command("command -v tc").code != 0) GTEST_SKIP() << "no `tc` (Debian: iproute2) to slow a link";
    CommandResult up = run_command(kHosts + " up " + prefix_ + " 3");
    if (up.code == 77) GTEST_SKIP() << "network namespaces cannot be made here: " << up.out;
    ASSERT_EQ(up.code, 0) << up.out;
    up_ = true;
    std::istringstream lines(up.out);
    std::getline(lines, agent_);
    std::getline(lines, net_);
  }
  void TearDown() override {
    if (up_) run_command(kHosts + " down " + prefix_);
  }
  std::string host(int i) const { return net_ + "." + std::to_string(i); }
  fs::path hostfile(const std::string& name, const std::vector<int>& hosts) const {
    std::ofstream f(dir_ / name);
    for (int i : hosts) f << host(i) << " slots=1\n";
    return dir_ / name;
  }
  // mpirun.sh with HEALTH_CHECK=1 on `hosts`, one rank a host, with the environment `env`.
  std::string launcher(const std::string& hosts, int np, const std::string& env, const std::string& args) const {
    return kRoot + env + " HEALTH_CHECK=1 MIN_HOSTS=1 HEALTH_PARALLEL=2" +
           " HEALTH_DOCTOR_ARGS='--model resnet20 --steps 2 --threads 1'" +
           " RANKS_PER_NODE=1 THREADS_PER_RANK=1 MPIRUN=" + MPIEXEC_EXECUTABLE + " SPOTRAIN=" + SPOTRAIN_BIN +
           " MPI_IFNAME=" + net_ + ".0/24 MPIRUN_ARGS='--mca plm_rsh_agent " + agent_ +
           " --mca rtc ^hwloc --mca btl tcp,self' " + SPOTRAIN_SOURCE_DIR + "/examples/resnet50/launch/mpirun.sh " +
           hosts + " " + std::to_string(np) + " " + args;
  }
  std::string train_args() const {
    return "--model resnet20 --data synthetic --train-limit 512 --test-limit 32 --batch-size 16 --steps 4"
           " --log-every 1 --ckpt-dir " + (dir_ / "run").string();
  }

  std::string prefix_, agent_, net_;
  fs::path dir_;
  bool up_ = false;
};

// Host 3's link at 20 Mbit/s into it, host 2's doctor broken: the gate names both with their
// reasons, and the job runs on host 1 alone and finishes.
TEST_F(HealthGate, ASlowLinkAndABrokenDoctorAreLeftOutAndTheRestTrain) {
  ASSERT_EQ(run_command("tc qdisc add dev " + prefix_ + "-v3 root tbf rate 20mbit burst 32kbit latency 400ms").code, 0);
  CommandResult r = run_command("timeout -k 10 300 " +
                                launcher(hostfile("hosts", {1, 2, 3}).string(), 3, "HEALTH_TEST_BREAK_HOST=" + host(2),
                                         train_args()));
  std::printf("%s", r.out.c_str());
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "health gate: left out " + host(2) + ": doctor: fail ops cpu blocked_fp32: op conv2d_forward"))
      << r.out;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.out, m, std::regex("health gate: left out " + std::regex_replace(host(3), std::regex("\\."), "\\.") +
                                                     ": link: ([0-9.]+) Mbit/s \\(its best pair, with [0-9.]+\\), "
                                                     "([0-9.]+)x the median")))
      << r.out;
  EXPECT_LT(std::stod(m[1]), 25.0) << "the rate-limited host measured faster than its limit";
  EXPECT_FALSE(contains(r.out, "left out " + host(1))) << r.out;
  EXPECT_TRUE(contains(r.out, "health gate: " + host(1) + ": link ")) << r.out;
  ASSERT_TRUE(std::regex_search(r.out, m, std::regex("health gate: 1 of 3 host\\(s\\) passed in ([0-9.]+) s "
                                                     "\\(the doctors ([0-9.]+) s\\): " +
                                                     std::regex_replace(host(1), std::regex("\\."), "\\."))))
      << r.out;
  const double gate = std::stod(m[1]), doctors = std::stod(m[2]);
  EXPECT_LE(gate, 60) << "the gate took longer than its 60 s";
  EXPECT_TRUE(contains(r.out, "mpirun.sh: 1 rank(s) on 1 node(s)")) << r.out;
  EXPECT_TRUE(contains(r.out, "finished 4 steps")) << r.out;
  EXPECT_TRUE(fs::exists(dir_ / "run" / "ckpt-00000004.h5")) << r.out;
  std::cout << "measured: the health gate on 3 hosts took " << gate << " s (the doctors " << doctors
            << " s, 2 at a time; the links " << gate - doctors << " s, one link at 20 Mbit/s)\n";
}

// With HOST_DISCOVERY the hosts left out stay listed by the discovery command; the launcher
// must not grow the job onto them as soon as its poller sees them (it leaves them out for
// LEAVE_FOR, as stragglers left behind).
TEST_F(HealthGate, WithHostDiscoveryAHostLeftOutIsNotGrownOntoAtOnce) {
  // (No link is slowed here: the loose share keeps the software bridge's swings on this busy
  // 2-core machine from leaving a host out; one was seen at 0.46x when a pair took the best of
  // 3, none below 0.89x since the best of as many as fit in a second.)
  const std::string env = "HOST_DISCOVERY='" + kHosts + " hosts " + prefix_ +
                          "' DISCOVERY_INTERVAL=1 HEALTH_LINK_ARGS='--link-min-share 0.1' HEALTH_TEST_BREAK_HOST=" +
                          host(2);
  const std::string args = "--model resnet20 --data synthetic --train-limit 4096 --test-limit 32 --batch-size 16"
                           " --steps 150 --log-every 10 --ckpt-dir " + (dir_ / "run").string();
  CommandResult r = run_command("timeout -k 10 300 " + launcher("-", 3, env, args));
  std::printf("%s", r.out.c_str());
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "health gate: left out " + host(2) + ": doctor: fail")) << r.out;
  EXPECT_TRUE(contains(r.out, "health gate: 2 of 3 host(s) passed")) << r.out;
  EXPECT_TRUE(contains(r.out, "mpirun.sh: 2 rank(s) on 2 node(s)")) << r.out;
  EXPECT_FALSE(contains(r.out, "growing it")) << "the job grew onto the host the gate left out:\n" << r.out;
  EXPECT_TRUE(contains(r.out, "finished 150 steps")) << r.out;
}

// Every host fails: fewer than MIN_HOSTS pass, one error line, exit 1, no rank started.
TEST_F(HealthGate, FewerThanMinHostsPassingEndsTheLaunchWithOneErrorLine) {
  CommandResult r = run_command("timeout -k 10 120 " + launcher(hostfile("broken", {2}).string(), 1,
                                                                "HEALTH_TEST_BREAK_HOST=" + host(2), train_args()));
  std::printf("%s", r.out.c_str());
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(contains(r.out, "health gate: left out " + host(2) + ": doctor: fail")) << r.out;
  EXPECT_TRUE(contains(r.out, "error: health gate: 0 of 1 host(s) passed in ")) << r.out;
  EXPECT_TRUE(contains(r.out, "fewer than MIN_HOSTS=1; not starting")) << r.out;
  EXPECT_FALSE(contains(r.out, "mpirun.sh: 1 rank(s)")) << r.out;
  EXPECT_FALSE(fs::exists(dir_ / "run")) << r.out;
}

}  // namespace

// The link check under a plain mpirun on this machine: three ranks, one line a "host" (named
// by --names), the all-reduce's bus bandwidth, exit 0, and the same in --json. No namespaces.
// --link-min-share 0: three processes sharing two loaded cores measure pairs 4x apart (a CI
// run once failed "b" at 0.28x the median); the verdicts are test_links' and the gate's above.
TEST(HealthLinks, TheLinkCheckReportsEveryHostAndTheAllReduce) {
  const fs::path json = fs::temp_directory_path() / "spotrain_links.json";
  fs::remove(json);
  CommandResult r = run_command("timeout -k 10 120 " + kRoot + MPIEXEC_EXECUTABLE +
                                " -np 3 --oversubscribe --bind-to none " + SPOTRAIN_BIN +
                                " doctor --links --link-mb 1 --link-min-share 0 --names a,b,c --json " + json.string());
  std::printf("%s", r.out.c_str());
  ASSERT_EQ(r.code, 0) << r.out;
  for (const char* h : {"a", "b", "c"})
    EXPECT_TRUE(std::regex_search(r.out, std::regex(std::string("ok    link ") + h +
                                                    ": [0-9.]+ [GMk]bit/s \\(its best pair, with [abc]\\), "
                                                    "[0-9.]+x the median")))
        << h << "\n" << r.out;
  EXPECT_TRUE(std::regex_search(r.out, std::regex("ok    allreduce 3 ranks: [0-9.]+ [GMk]bit/s bus bandwidth")))
      << r.out;
  EXPECT_TRUE(contains(r.out, "doctor --links: healthy: 3 hosts, 0 failed")) << r.out;
  std::ifstream in(json);
  const nlohmann::json j = nlohmann::json::parse(in);
  EXPECT_TRUE(j.at("healthy").get<bool>());
  ASSERT_EQ(j.at("hosts").size(), 3u);
  EXPECT_EQ(j["hosts"][1]["name"], "b");
  EXPECT_GT(j["hosts"][1]["bytes_per_sec"].get<double>(), 0);
  EXPECT_GT(j.at("allreduce_bus_bytes_per_sec").get<double>(), 0);

  // Alone (no MPI job), one error line.
  CommandResult alone = run_command(std::string(SPOTRAIN_BIN) + " doctor --links");
  EXPECT_EQ(alone.code, 1) << alone.out;
  EXPECT_TRUE(contains(alone.out, "error: the link check measures the links between the ranks of an MPI job"))
      << alone.out;
}
