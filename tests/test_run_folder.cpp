// The run folder is the job: one lock per folder (a second process is refused, naming the
// holder even in the moment it takes the lock; a lock left by a killed process is not),
// another run's folder is refused unless resumed or moved aside with --new-run, the newest good
// checkpoint is resumed from (past a corrupt one; a resume from a named one sets the newer ones
// aside), --resume latest never starts over, the metrics history stays whole and continuous
// across three restarts (and the folder's config.toml restarts the run), and config files and
// choices are checked strictly.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "run_command.h"

namespace fs = std::filesystem;

namespace {

CommandResult spotrain(const std::string& args, const std::string& env = "") {
  return run_command(env + (env.empty() ? "" : " ") + SPOTRAIN_BIN + " " + args);
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

fs::path fresh_dir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / name;
  fs::remove_all(d);
  return d;
}

// A short run on synthetic data into `dir`.
std::string train(const fs::path& dir, const std::string& more = "") {
  return "train --model resnet20 --data synthetic --train-limit 64 --test-limit 32 --batch-size 16 "
         "--threads 1 --log-every 1 --ckpt-dir " + dir.string() + " " + more;
}

std::vector<nlohmann::json> read_jsonl(const fs::path& p) {
  std::vector<nlohmann::json> out;
  std::ifstream f(p);
  for (std::string line; std::getline(f, line);)
    if (!line.empty()) out.push_back(nlohmann::json::parse(line));
  return out;
}

}  // namespace

TEST(RunFolder, ASecondProcessIsRefusedAndAKilledHoldersLockDoesNot) {
  fs::path d = fresh_dir("spotrain_run_lock");
  fs::create_directories(d);
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  pid_t holder = fork();
  ASSERT_GE(holder, 0);
  if (holder == 0) {  // holds the folder's lock as a running spotrain would, then sleeps
    int fd = ::open((d / ".lock").c_str(), O_RDWR | O_CREAT, 0644);
    if (fd < 0 || ::flock(fd, LOCK_EX) != 0) _exit(1);
    const char note[] = "pid 4242 on testhost, since earlier\n";
    if (::write(fd, note, sizeof note - 1) < 0) _exit(1);
    if (::write(ready[1], "x", 1) != 1) _exit(1);
    for (;;) pause();
  }
  char c;
  ASSERT_EQ(::read(ready[0], &c, 1), 1);
  CommandResult r = spotrain(train(d, "--steps 2"));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(contains(r.out, "is in use by another spotrain process (pid 4242 on testhost"))
      << r.out;
  EXPECT_FALSE(fs::exists(d / "ckpt-00000002.h5"));
  // The holder dies without cleaning up (SIGKILL, as a lost process): the kernel drops its
  // lock, and the folder is usable at once.
  kill(holder, SIGKILL);
  waitpid(holder, nullptr, 0);
  r = spotrain(train(d, "--steps 2"));
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(fs::exists(d / "ckpt-00000002.h5")) << r.out;
}

// A process refused while the holder has taken the lock but not yet written its record (the
// hook holds it there for far longer than a start-up) still names the holder: never "holder
// unknown", nor the record a dead holder left in the file.
TEST(RunFolder, ARefusedProcessNamesAHolderThatHasNotWrittenItsRecordYet) {
  fs::path d = fresh_dir("spotrain_run_lock_record");
  fs::create_directories(d);
  std::ofstream(d / ".lock") << "pid 1 on gone-host, since long ago\n";
  FILE* first = popen(("SPOTRAIN_RUN_LOCK_DELAY=5 " + std::string(SPOTRAIN_BIN) + " " +
                       train(d, "--steps 2") + " 2>&1").c_str(), "r");
  ASSERT_NE(first, nullptr);
  std::string first_out, holder;  // "pid N on ", as the hook names the first process
  char line[4096];
  while (holder.empty() && std::fgets(line, sizeof line, first)) {
    first_out += line;
    int pid = 0;
    if (std::sscanf(line, "SPOTRAIN_RUN_LOCK_DELAY: pid %d", &pid) == 1)
      holder = "pid " + std::to_string(pid) + " on ";
  }
  CommandResult second = spotrain(train(d, "--steps 2"));
  while (std::fgets(line, sizeof line, first)) first_out += line;
  const int st = pclose(first);
  ASSERT_FALSE(holder.empty()) << first_out;
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << first_out;
  EXPECT_EQ(second.code, 1) << second.out;
  EXPECT_TRUE(contains(second.out, "is in use by another spotrain process (" + holder)) << second.out;
}

TEST(RunFolder, AnotherRunsFolderIsRefusedUnlessResumedOrMovedAside) {
  fs::path d = fresh_dir("spotrain_run_owner");
  CommandResult a = spotrain(train(d, "--steps 2 --seed 0"));
  ASSERT_EQ(a.code, 0) << a.out;
  // A new run with the same command into the folder: refused, naming the way out.
  CommandResult again = spotrain(train(d, "--steps 2 --seed 0"));
  EXPECT_EQ(again.code, 1) << again.out;
  EXPECT_TRUE(contains(again.out, "holds another run's checkpoints")) << again.out;
  EXPECT_TRUE(contains(again.out, "--resume auto")) << again.out;
  // Resuming it with another seed: a different run.
  CommandResult other = spotrain(train(d, "--steps 4 --seed 1 --resume auto"));
  EXPECT_EQ(other.code, 1) << other.out;
  // ... naming the file the other settings were read from.
  EXPECT_TRUE(contains(other.out, "holds a different run (--seed 0 there, 1 here; 'there' as " +
                                      (d / "run.json").string() + " records it)")) << other.out;
  EXPECT_FALSE(fs::exists(d / "ckpt-00000004.h5"));
  // --new-run moves the old run's files aside, intact.
  CommandResult fresh = spotrain(train(d, "--steps 2 --seed 1 --new-run"));
  ASSERT_EQ(fresh.code, 0) << fresh.out;
  int previous = 0;
  for (auto& e : fs::directory_iterator(d)) {
    if (e.path().filename().string().rfind("previous-", 0) != 0) continue;
    ++previous;
    EXPECT_TRUE(fs::exists(e.path() / "ckpt-00000002.h5")) << e.path();
    EXPECT_TRUE(fs::exists(e.path() / "run.json")) << e.path();
  }
  EXPECT_EQ(previous, 1);
  auto run = nlohmann::json::parse(std::ifstream(d / "run.json"));
  EXPECT_EQ(run["fingerprint"]["seed"], 1) << run.dump();
  // A folder whose run died before its first checkpoint is still that run's.
  fs::path e = fresh_dir("spotrain_run_owner_empty");
  fs::create_directories(e);
  std::ofstream(e / "run.json") << "{\"fingerprint\": {\"model\": \"resnet50\"}}\n";
  CommandResult empty = spotrain(train(e, "--steps 2"));
  EXPECT_EQ(empty.code, 1) << empty.out;
  EXPECT_TRUE(contains(empty.out, "belongs to another run (" + (e / "run.json").string())) << empty.out;
  // And the new run continues as itself.
  CommandResult more = spotrain(train(d, "--steps 4 --seed 1 --resume auto"));
  EXPECT_EQ(more.code, 0) << more.out;
  EXPECT_TRUE(contains(more.out, "resumed from " + (d / "ckpt-00000002.h5").string())) << more.out;
}

TEST(RunFolder, TheNewestGoodCheckpointIsUsedAndANamedResumeSetsTheNewerOnesAside) {
  fs::path d = fresh_dir("spotrain_run_latest");
  ASSERT_EQ(spotrain(train(d, "--steps 4 --ckpt-every 2")).code, 0);
  std::string latest;
  std::getline(std::ifstream(d / "latest"), latest);
  ASSERT_EQ(latest, "ckpt-00000004.h5");
  // `latest` lagging behind (another writer of the folder has not moved it yet): the newest
  // file that verifies is the one to continue from.
  std::ofstream(d / "latest") << "ckpt-00000002.h5\n";
  CommandResult r = spotrain("eval --ckpt " + d.string() + " --data synthetic --test-limit 32 --threads 1");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "ckpt-00000004.h5 (resnet20, step 4)")) << r.out;
  // The newest corrupt: reported, and the good one before it used.
  fs::resize_file(d / "ckpt-00000004.h5", fs::file_size(d / "ckpt-00000004.h5") / 2);
  r = spotrain(train(d, "--steps 6 --ckpt-every 2 --resume auto"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "skipping unusable checkpoint")) << r.out;
  EXPECT_TRUE(contains(r.out, "resumed from " + (d / "ckpt-00000002.h5").string())) << r.out;
  // Back to a named checkpoint (say, to train on from before a divergence): the ones after it
  // move aside, so that a later --resume auto continues this branch, not the abandoned one.
  r = spotrain(train(d, "--steps 4 --ckpt-every 3 --resume " + (d / "ckpt-00000002.h5").string()));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "the 2 checkpoint(s) after it in " + d.string() + " moved to")) << r.out;
  std::vector<std::string> aside;
  for (auto& e : fs::directory_iterator(d))
    if (e.path().filename().string().rfind("abandoned-", 0) == 0)
      for (auto& f : fs::directory_iterator(e.path())) aside.push_back(f.path().filename().string());
  std::sort(aside.begin(), aside.end());
  EXPECT_EQ(aside, (std::vector<std::string>{"ckpt-00000004.h5", "ckpt-00000006.h5"}));
  r = spotrain(train(d, "--steps 5 --ckpt-every 3 --resume auto"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "resumed from " + (d / "ckpt-00000004.h5").string() + ": step 4")) << r.out;
}

// --resume latest (what a launcher passes once a checkpoint was written) never starts over:
// with no checkpoint in the folder it is an error; auto starts from scratch.
TEST(RunFolder, ResumeLatestRefusesToStartOverWhereAutoStartsFromScratch) {
  fs::path d = fresh_dir("spotrain_run_resume_latest");
  CommandResult r = spotrain(train(d, "--steps 2 --resume latest"));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(contains(r.out, "--resume latest: no checkpoint of this run in " + d.string())) << r.out;
  EXPECT_FALSE(fs::exists(d / "ckpt-00000002.h5")) << "it trained anyway";
  r = spotrain(train(d, "--steps 2 --resume auto"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "starting from scratch")) << r.out;
  r = spotrain(train(d, "--steps 3 --resume latest"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "resumed from " + (d / "ckpt-00000002.h5").string())) << r.out;
  EXPECT_NE(spotrain("train --data synthetic --resume latest").code, 0) << "latest needs a --ckpt-dir";
}

TEST(RunFolder, MetricsStayWholeAcrossThreeRestartsAndConfigTomlRestartsTheRun) {
  fs::path d = fresh_dir("spotrain_run_metrics");
  const std::string args = train(d, "--steps 12 --ckpt-every 3 --deterministic");
  CommandResult r = spotrain(args, "SPOTRAIN_FAULT=term:0:4");
  ASSERT_EQ(r.code, 75) << r.out;
  for (int stop : {7, 10}) {
    r = spotrain(args + " --resume auto", "SPOTRAIN_FAULT=term:0:" + std::to_string(stop));
    ASSERT_EQ(r.code, 75) << r.out;
  }
  // The last restart from the folder's own settings file alone.
  ASSERT_TRUE(fs::exists(d / "config.toml"));
  r = spotrain("train --config " + (d / "config.toml").string());
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "resumed from " + (d / "ckpt-00000010.h5").string())) << r.out;

  std::map<std::string, int> types;
  std::multiset<int64_t> steps;
  std::vector<int64_t> resumed_at;
  for (const auto& j : read_jsonl(d / "metrics.jsonl")) {
    const std::string type = j["type"];
    ++types[type];
    EXPECT_TRUE(j.contains("time") && j["time"].is_string()) << j.dump();
    EXPECT_TRUE(j.contains("elapsed") && j["elapsed"].get<double>() >= 0) << j.dump();
    if (type == "step") steps.insert(j["step"].get<int64_t>());
    if (type == "resume") {
      resumed_at.push_back(j["step"].get<int64_t>());
      EXPECT_EQ(j["previous"], "stopped by SIGTERM") << j.dump();
    }
  }
  EXPECT_EQ(types["start"], 4);
  EXPECT_EQ(types["stop"], 3);
  EXPECT_EQ(types["end"], 1);
  EXPECT_EQ(resumed_at, (std::vector<int64_t>{4, 7, 10}));
  // Every step recorded exactly once, none lost to a restart.
  std::multiset<int64_t> all;
  for (int64_t s = 1; s <= 12; ++s) all.insert(s);
  EXPECT_EQ(steps, all);
  // The log holds every process's lines.
  std::ifstream log(d / "train.log");
  std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n') > 20, true) << text;
  EXPECT_TRUE(contains(text, "stopped by SIGTERM after step 7")) << text;
}

// A kill in step 7, after the last checkpoint (4): the resume trains steps 5 and 6 again. Their first records
// are marked superseded (the unmarked ones are one history, each step once) and `report --csv`
// keeps one row per step; settings are stored as given (0.1, not float's 0.10000000149011612).
// (The checkpoint of step 4 is a stop's, written before the process ends: a periodic one is
// written in the background, and under load a kill two steps later could come before it.)
TEST(RunFolder, RecordsOfStepsTrainedAgainAreMarkedSupersededAndReportKeepsOneHistory) {
  fs::path d = fresh_dir("spotrain_run_superseded");
  const std::string args = train(d, "--steps 8 --lr 0.1 --weight-decay 0.0001");
  CommandResult r = spotrain(args, "SPOTRAIN_FAULT=term:0:4");
  ASSERT_EQ(r.code, 75) << r.out;
  ASSERT_TRUE(fs::exists(d / "ckpt-00000004.h5")) << r.out;
  r = spotrain(args + " --resume auto", "SPOTRAIN_FAULT=die:0:7");
  ASSERT_NE(r.code, 0) << r.out;
  r = spotrain(args + " --resume auto");
  ASSERT_EQ(r.code, 0) << r.out;
  std::vector<int64_t> kept, marked;
  int64_t resume_says = -1;
  for (const auto& j : read_jsonl(d / "metrics.jsonl")) {
    if (j["type"] == "resume") resume_says = j["superseded_records"].get<int64_t>();
    if (j["type"] != "step") continue;
    (j.value("superseded", false) ? marked : kept).push_back(j["step"].get<int64_t>());
  }
  EXPECT_EQ(marked, (std::vector<int64_t>{5, 6}));
  EXPECT_EQ(kept, (std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 8}));
  EXPECT_EQ(resume_says, 2);  // the two step records
  const fs::path csv = d / "records.csv";
  r = spotrain("report " + d.string() + " --csv " + csv.string());
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "left out")) << r.out;
  std::ifstream f(csv);
  std::string header, line;
  std::getline(f, header);
  int steps = 0;
  for (; std::getline(f, line);) steps += line.find(",step,") != std::string::npos;
  EXPECT_EQ(steps, 8) << "one CSV row per step";
  std::ifstream toml(d / "config.toml");
  std::string text((std::istreambuf_iterator<char>(toml)), std::istreambuf_iterator<char>());
  EXPECT_TRUE(contains(text, "\nlr = 0.1\n")) << text;
  EXPECT_TRUE(contains(text, "\nweight-decay = 0.0001\n")) << text;
  // Every field keeps one type in every record it appears in (null aside), nested ones too.
  std::map<std::string, std::set<std::string>> types;
  std::function<void(const nlohmann::json&, const std::string&)> walk = [&](const nlohmann::json& v,
                                                                          const std::string& key) {
    if (v.is_object()) {
      types[key].insert("object");
      for (auto it = v.begin(); it != v.end(); ++it) walk(it.value(), key + "." + it.key());
    } else if (!v.is_null()) {
      types[key].insert(v.is_number() ? "number" : v.type_name());
    }
  };
  for (const auto& j : read_jsonl(d / "metrics.jsonl")) {
    if (j["type"] == "start") {
      EXPECT_EQ(j["config"]["lr"].dump(), "0.1") << j.dump();
    }
    walk(j, "");
  }
  for (const auto& [key, seen] : types) EXPECT_EQ(seen.size(), 1u) << key << " has more than one type";
}

TEST(ConfigFile, UnknownKeysFlatKeysAndChoices) {
  fs::path c = fs::temp_directory_path() / "spotrain_strict.toml";
  std::ofstream(c) << "[train]\nbatch-sise = 4\n";
  CommandResult r = spotrain("train --config " + c.string());
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(contains(r.out, "batch-sise")) << r.out;
  EXPECT_TRUE(contains(r.out, c.string())) << r.out;
  // Keys before any section are the subcommand's (the README's own example form).
  std::ofstream(c) << "# flat keys\nmodel = \"resnet20\"\ndata = \"synthetic\"\ntrain-limit = 32\n"
                      "steps = 2\nbatch-size = 8\nthreads = 1\nckpt-dir = \"\"\n";
  r = spotrain("train --config " + c.string());
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "step 2/2")) << r.out;
  EXPECT_TRUE(contains(r.out, "batch 8")) << r.out;
  // A value outside a setting's choices: refused while parsing, with the allowed ones.
  r = spotrain("train --precision fp64 --steps 1");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(contains(r.out, "fp64") && contains(r.out, "bf16")) << r.out;
  std::ofstream(c) << "[train]\nlr-schedule = \"linear\"\n";
  r = spotrain("train --config " + c.string());
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(contains(r.out, "linear") && contains(r.out, "cosine")) << r.out;
  // Usage lines name the program.
  r = spotrain("train --help");
  EXPECT_TRUE(contains(r.out, "Usage: spotrain train")) << r.out;
}
