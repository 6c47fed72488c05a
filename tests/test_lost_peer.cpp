// A hard reclaim loses nothing (real processes under mpirun and the project's launcher, on one
// machine): a rank SIGKILLed with no checkpoint since the start leaves the last step every rank
// finished saved and verified by a survivor, and the job resumes on the rank that remains; a
// kill during that save leaves no file that verifies with the wrong contents. Node-local disks
// (a mount namespace per rank, tests/rank_disk.sh): every checkpoint is on every rank's disk, a
// rank 0 with an empty disk resumes from another's copy (and writes its own copy of it at once)
// and the run ends bitwise equal to an
// uninterrupted one; two of three disks lost lose nothing, all of them lost is refused until
// --new-run. Each launch runs under `timeout`.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>

#include "ckpt_state.h"
#include "scratch_dir.h"

namespace fs = std::filesystem;

namespace {

struct Launch {
  int code = -1;
  std::string out;
};

Launch run(const std::string& cmd, int limit_s = 150) {
  setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 0);
  setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 0);
  const std::string full = "timeout -k 10 " + std::to_string(limit_s) + " " + cmd + " 2>&1";
  Launch r;
  FILE* p = popen(full.c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  const int st = pclose(p);
  r.code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  return r;
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

std::string ckpt(const fs::path& dir, int64_t step) {
  char name[32];
  std::snprintf(name, sizeof name, "ckpt-%08lld.h5", static_cast<long long>(step));
  return (dir / name).string();
}

bool verifies(const std::string& path) {
  return run(std::string(SPOTRAIN_BIN) + " ckpt verify " + path).code == 0;
}

// The highest step a progress line showed ("step N/").
int64_t last_logged_step(const std::string& out) {
  int64_t last = -1;
  static const std::regex re("step (\\d+)/\\d+ loss");
  for (std::sregex_iterator it(out.begin(), out.end(), re), end; it != end; ++it)
    last = std::max<int64_t>(last, std::stoll((*it)[1]));
  return last;
}

// The training arguments: resnet20 on synthetic data, one thread, a progress line each step.
std::string train(const fs::path& dir, const std::string& more) {
  return " --model resnet20 --data synthetic --train-limit 2048 --test-limit 64 --batch-size 16"
         " --threads 1 --log-every 1 --deterministic --keep 100 --ckpt-dir " + dir.string() + " " + more;
}

// The project's launcher on this machine: 2 ranks (RANKS_PER_NODE) on localhost; `binary` is
// what it starts as `spotrain`.
std::string launcher(const fs::path& d, int ranks, const std::string& env, const std::string& binary = SPOTRAIN_BIN) {
  std::ofstream(d / "hosts") << "localhost slots=" << ranks << "\n";
  return "env " + env + " RANKS_PER_NODE=" + std::to_string(ranks) + " THREADS_PER_RANK=1 MPIRUN=" +
         MPIEXEC_EXECUTABLE + " MPIRUN_ARGS=--oversubscribe SPOTRAIN=" + binary + " " + SPOTRAIN_SOURCE_DIR +
         "/examples/resnet50/launch/mpirun.sh " + (d / "hosts").string() + " " + std::to_string(ranks);
}

// A `spotrain` (the script d/name) that runs on the rank's own disk, DISKS/disk-RANK, at
// `mount` (tests/rank_disk.sh).
std::string on_own_disk(const fs::path& d, const std::string& name, const fs::path& disks, const fs::path& mount) {
  const fs::path script = d / name;
  std::ofstream(script) << "#!/bin/sh\nexec " << SPOTRAIN_SOURCE_DIR << "/tests/rank_disk.sh " << disks.string()
                        << " " << mount.string() << " " << SPOTRAIN_BIN << " \"$@\"\n";
  fs::permissions(script, fs::perms::owner_all);
  return script.string();
}

bool can_mount() { return ::geteuid() == 0 && run("unshare -m true").code == 0; }

}  // namespace

// A rank SIGKILLed at step 6 (no notice, no periodic checkpoint): the survivor saves step 5,
// the last step both ranks finished, verified; the launcher ends 76; the job resumes on the
// rank that remains at step 6.
TEST(LostPeer, ASigkilledRanksSurvivorSavesTheLastFinishedStep) {
  const fs::path d = fresh_dir("spotrain_lost_peer"), run_dir = d / "run";
  Launch a = run(launcher(d, 2, "SPOTRAIN_FAULT=die:1:6 EXTRA_ENV=SPOTRAIN_FAULT SURVIVOR_WAIT=4") +
                 train(run_dir, "--steps 12"));
  EXPECT_EQ(a.code, 76) << "a lost peer is the retryable exit:\n" << a.out;
  EXPECT_TRUE(contains(a.out, "rank 1: SPOTRAIN_FAULT die at step 6")) << a.out;
  const int64_t logged = last_logged_step(a.out);
  ASSERT_GE(logged, 4) << a.out;
  ASSERT_TRUE(contains(a.out, "saved the last step every rank finished, step 5, to " + ckpt(run_dir, 5)))
      << a.out;
  EXPECT_GE(5, logged) << "a step was logged that the save does not hold:\n" << a.out;
  EXPECT_TRUE(verifies(ckpt(run_dir, 5)));
  EXPECT_FALSE(fs::exists(run_dir / ".survivor-5")) << "the claim of a finished save stays";
  std::ifstream m(run_dir / "metrics.jsonl");
  std::string all((std::istreambuf_iterator<char>(m)), {});
  EXPECT_TRUE(contains(all, "\"type\":\"lost_peer\"")) << all;
  // On the one rank that remains: from step 5, on with step 6.
  Launch b = run(std::string(SPOTRAIN_BIN) + " train" + train(run_dir, "--steps 12 --resume auto"));
  EXPECT_EQ(b.code, 0) << b.out;
  EXPECT_TRUE(contains(b.out, "resumed from " + ckpt(run_dir, 5) + ": step 5")) << b.out;
  EXPECT_TRUE(std::regex_search(b.out, std::regex("step 6/12 loss"))) << b.out;
}

// The survivor's save is cut short by Open MPI's SIGKILL (its write held in the middle by
// SPOTRAIN_CKPT_WRITE_DELAY): no file of that step verifies, nothing that verifies holds
// anything else than its step, and the resume takes the periodic checkpoint before it.
TEST(LostPeer, AKillDuringTheSurvivorsSaveLeavesNoFalseCheckpoint) {
  const fs::path d = fresh_dir("spotrain_lost_peer_cut"), run_dir = d / "run";
  Launch a = run(launcher(d, 2, "SPOTRAIN_FAULT=die:1:6 SPOTRAIN_CKPT_WRITE_DELAY=60:5 "
                                "EXTRA_ENV='SPOTRAIN_FAULT SPOTRAIN_CKPT_WRITE_DELAY' SURVIVOR_WAIT=2") +
                 train(run_dir, "--steps 12 --ckpt-every 3"));
  EXPECT_EQ(a.code, 76) << a.out;
  EXPECT_FALSE(contains(a.out, "saved the last step")) << a.out;
  EXPECT_FALSE(verifies(ckpt(run_dir, 5))) << "a save cut short must not verify";
  for (auto& e : fs::directory_iterator(run_dir)) {
    const std::string n = e.path().filename().string();
    if (e.path().extension() != ".h5") continue;
    EXPECT_EQ(n, "ckpt-00000003.h5") << "only the periodic checkpoint is whole";
    EXPECT_TRUE(verifies(e.path().string())) << n;
  }
  Launch b = run(std::string(SPOTRAIN_BIN) + " train" + train(run_dir, "--steps 12 --resume auto"));
  EXPECT_EQ(b.code, 0) << b.out;
  EXPECT_TRUE(contains(b.out, "resumed from " + ckpt(run_dir, 3) + ": step 3")) << b.out;
}

// Node-local disks: the folder is found not shared, every checkpoint is on both disks, and a
// restart whose rank 0 has an empty disk resumes from rank 1's copy and ends bitwise where an
// uninterrupted run ends.
TEST(NodeLocal, EveryCheckpointIsOnEachDiskAndAnEmptyRank0DiskResumesFromACopy) {
  if (!can_mount()) GTEST_SKIP() << "private mount namespaces need root";
  const fs::path d = fresh_dir("spotrain_node_local"), mount = d / "ckpt";
  const std::string own = on_own_disk(d, "on-disks", d / "disks", mount),
                    ref_own = on_own_disk(d, "on-ref-disks", d / "ref-disks", mount);
  const std::string args = train(mount, "--steps 10 --ckpt-every 2");
  Launch ref = run(launcher(d, 2, "", ref_own) + args);
  ASSERT_EQ(ref.code, 0) << ref.out;
  Launch a = run(launcher(d, 2, "SPOTRAIN_FAULT=term:0:5 EXTRA_ENV=SPOTRAIN_FAULT", own) + args);
  ASSERT_EQ(a.code, 75) << a.out;
  EXPECT_TRUE(contains(a.out, "not shared: 2 separate folders")) << a.out;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(a.out, m, std::regex("stopped by SIGTERM after step (\\d+)"))) << a.out;
  const int64_t stop = std::stoll(m[1]);
  for (const char* disk : {"disk-0", "disk-1"})
    EXPECT_TRUE(verifies(ckpt(d / "disks" / disk, stop))) << disk << " lacks the stop checkpoint";
  CkptState c0 = load_ckpt_state(ckpt(d / "disks" / "disk-0", stop)),
            c1 = load_ckpt_state(ckpt(d / "disks" / "disk-1", stop));
  EXPECT_EQ(std::memcmp(c0.params.data(), c1.params.data(), c0.params.size() * 4), 0) << "the copies differ";
  // Rank 0's host is replaced: a new, empty disk.
  fs::remove_all(d / "disks" / "disk-0");
  Launch b = run(launcher(d, 2, "", own) + args + " --resume auto");
  ASSERT_EQ(b.code, 0) << b.out;
  EXPECT_TRUE(contains(b.out, "resumed from " + fs::path(ckpt(mount, stop)).filename().string() + " (rank 1's copy)"))
      << b.out;
  // The empty disk holds the run again at once, not only from the next checkpoint on.
  EXPECT_TRUE(contains(b.out, "this rank's folder lacked the checkpoint resumed from: writing its copy " +
                                  ckpt(mount, stop))) << b.out;
  CkptState want = load_ckpt_state(ckpt(d / "ref-disks" / "disk-0", 10));
  for (const char* disk : {"disk-0", "disk-1"}) {
    CkptState got = load_ckpt_state(ckpt(d / "disks" / disk, 10));
    ASSERT_EQ(got.params.size(), want.params.size());
    EXPECT_EQ(std::memcmp(got.params.data(), want.params.data(), want.params.size() * 4), 0) << disk;
    EXPECT_EQ(std::memcmp(got.momentum.data(), want.momentum.data(), want.momentum.size() * 4), 0) << disk;
  }
}

// Three ranks on their own disks; two are killed at once: the survivor's disk holds the last
// finished step, and with the other two disks new the job resumes from it. When no disk holds
// a checkpoint of the run any more, the run refuses to start over silently: --new-run does.
TEST(NodeLocal, TwoOfThreeDisksLostLoseNothingAndAllLostIsRefused) {
  if (!can_mount()) GTEST_SKIP() << "private mount namespaces need root";
  const fs::path d = fresh_dir("spotrain_node_local_3"), mount = d / "ckpt", disks = d / "disks";
  const std::string own = on_own_disk(d, "on-disks", disks, mount);
  const std::string args = train(mount, "--steps 9 --ckpt-every 3");
  Launch a = run(launcher(d, 3, "SPOTRAIN_FAULT=die:1:5,die:2:5 EXTRA_ENV=SPOTRAIN_FAULT SURVIVOR_WAIT=6", own) + args);
  EXPECT_EQ(a.code, 76) << a.out;
  EXPECT_TRUE(contains(a.out, "rank 0: saved the last step every rank finished, step 4")) << a.out;
  fs::remove_all(disks / "disk-1");
  fs::remove_all(disks / "disk-2");
  Launch b = run(launcher(d, 3, "", own) + args + " --resume auto");
  ASSERT_EQ(b.code, 0) << b.out;
  EXPECT_TRUE(contains(b.out, "resumed from " + ckpt(mount, 4) + ": step 4")) << "nothing lost:\n" << b.out;
  for (const char* disk : {"disk-0", "disk-1", "disk-2"}) EXPECT_TRUE(verifies(ckpt(disks / disk, 9))) << disk;
  // Every copy lost: the checkpoints are gone from every disk, `latest` says there were some.
  for (const char* disk : {"disk-0", "disk-1", "disk-2"})
    for (auto& e : fs::directory_iterator(disks / disk))
      if (e.path().extension() == ".h5") fs::remove(e.path());
  Launch c = run(launcher(d, 3, "", own) + args + " --resume auto");
  EXPECT_EQ(c.code, 1) << c.out;
  EXPECT_TRUE(contains(c.out, "every copy was lost")) << c.out;
  EXPECT_TRUE(contains(c.out, "--new-run")) << c.out;
  Launch n = run(launcher(d, 3, "", own) + args + " --resume auto --new-run");
  EXPECT_EQ(n.code, 0) << n.out;
  EXPECT_TRUE(contains(n.out, "no checkpoint in")) << "it starts over:\n" << n.out;
}
