// core/atomic_file.h: a file is replaced whole or not at all. A write leaves the new contents
// and no temporary; a write that cannot happen throws naming the file and the cause and leaves
// the old file as it was; commit_file publishes a file written by other means, and removes it
// when it cannot.
#include <gtest/gtest.h>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "core/atomic_file.h"
#include "core/log.h"
#include "core/error.h"
#include "scratch_dir.h"

namespace fs = std::filesystem;
using namespace spotrain;

namespace {

std::string read(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace

TEST(AtomicFile, ReplacesTheContentsAndLeavesNoTemporary) {
  const fs::path d = fresh_dir("spotrain_atomic_replace");
  const std::string path = (d / "settings.toml").string();
  for (Durability dur : {Durability::synced, Durability::visible}) {
    write_file_atomic(path, "first\n", "the settings", dur);
    EXPECT_EQ(read(path), "first\n");
    std::string big(1 << 20, 'x');  // more than one write() may take
    big += "end";
    write_file_atomic(path, big, "the settings", dur);
    EXPECT_EQ(read(path), big);
    EXPECT_TRUE(temporaries_in(d).empty());
  }
}

TEST(AtomicFile, AFailedWriteNamesTheFileAndKeepsTheOldOne) {
  // A missing folder fails for any user (root writes into read-only folders).
  const fs::path d = fresh_dir("spotrain_atomic_fail");
  const std::string missing = (d / "gone" / "latest").string();
  try {
    write_file_atomic(missing, "x", "the checkpoint pointer");
    FAIL() << "a write into a missing folder must throw";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("the checkpoint pointer"), std::string::npos) << m;
    EXPECT_NE(m.find(missing), std::string::npos) << m;
    EXPECT_NE(m.find("No such file"), std::string::npos) << m;
  }
  // A rename that cannot happen (the target is a non-empty folder): the old target stays, the
  // temporary is removed.
  const fs::path target = d / "busy";
  fs::create_directories(target / "inside");
  EXPECT_THROW(write_file_atomic(target.string(), "new", "the report"), Error);
  EXPECT_TRUE(fs::is_directory(target / "inside"));
  EXPECT_TRUE(temporaries_in(d).empty());
}

TEST(AtomicFile, WritersOfOneFileAtOnceNeverShareATemporary) {
  const fs::path d = fresh_dir("spotrain_atomic_concurrent");
  const std::string path = (d / "latest").string();
  EXPECT_NE(temp_path_for(path), temp_path_for(path));
  // Hosts too (shared storage; containers on two hosts may give their writers one pid).
  EXPECT_NE(temp_path_for(path).find("." + host_name() + "-"), std::string::npos) << temp_path_for(path);
  // Threads replacing one file together: each rename publishes a whole file of one writer.
  std::vector<std::thread> writers;
  std::atomic<int> failed{0};
  for (int w = 0; w < 4; ++w)
    writers.emplace_back([&, w] {
      const std::string mine = std::string(4096, char('a' + w)) + "\n";
      for (int i = 0; i < 200; ++i) try {
          write_file_atomic(path, mine, "the checkpoint pointer", Durability::visible);
        } catch (const std::exception&) {
          ++failed;
        }
    });
  for (auto& t : writers) t.join();
  EXPECT_EQ(failed.load(), 0);
  const std::string got = read(path);
  ASSERT_EQ(got.size(), 4097u);
  EXPECT_EQ(got.find_first_not_of(got[0]), 4096u) << "one writer's contents, whole";
  EXPECT_TRUE(temporaries_in(d).empty());
}

TEST(AtomicFile, CommitPublishesAWrittenFileOrRemovesIt) {
  const fs::path d = fresh_dir("spotrain_atomic_commit");
  const std::string path = (d / "ckpt-00000001.h5").string(), tmp = temp_path_for(path);
  std::ofstream(tmp) << "contents";
  commit_file(tmp, path, "the checkpoint");
  EXPECT_EQ(read(path), "contents");
  EXPECT_FALSE(fs::exists(tmp));
  // Nothing to commit: an error naming the temporary.
  try {
    commit_file(tmp, path, "the checkpoint");
    FAIL() << "committing a missing file must throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(tmp), std::string::npos) << e.what();
  }
  EXPECT_EQ(read(path), "contents");  // the published file is untouched
  // A rename that cannot happen: the temporary goes, the target stays.
  const fs::path target = d / "busy";
  fs::create_directories(target / "inside");
  const std::string tmp2 = temp_path_for(target.string());
  std::ofstream(tmp2) << "x";
  EXPECT_THROW(commit_file(tmp2, target.string(), "the checkpoint"), Error);
  EXPECT_FALSE(fs::exists(tmp2));
  EXPECT_TRUE(fs::is_directory(target / "inside"));
}
