// Checkpoint folders that fail under a running job, on real filesystems: a tmpfs that fills up
// during a background write, and one remounted read-only mid-run (each in a private mount
// namespace, so nothing shows outside the test; skipped where unshare cannot make one). The
// run ends with one error line naming the cause and the newest good checkpoint, every earlier
// checkpoint verifies, no partial file is left, and the run resumes once the folder is fixed;
// with --on-ckpt-error continue it trains on and checkpoints again when space returns.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <string>

#include "run_command.h"
#include "text_search.h"

namespace fs = std::filesystem;

namespace {

class CkptFailures : public ::testing::Test {
 protected:
  void SetUp() override {
    if (run_command("unshare --mount --propagation private true").code != 0)
      GTEST_SKIP() << "cannot make a mount namespace here (unshare needs root)";
    dir_ = fs::temp_directory_path() /
           ("spotrain_ckpt_fail_" +
            std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "mnt");
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Runs `body` in a private mount namespace with a tmpfs of `mib` MiB at $mnt. The body may
  // use `train ARGS...` (spotrain train on resnet20 with checkpoints in $mnt/run), `report`
  // (prints "VERIFY name rc" per checkpoint and "LEFT name" per partial file) and $log.
  CommandResult in_tmpfs(int mib, const std::string& body) const {
    fs::path script = dir_ / "script.sh";
    std::ofstream(script)
        << "set -u\nmnt=" << (dir_ / "mnt").string() << "\nlog=" << (dir_ / "log").string() << "\n"
        << "mount -t tmpfs -o size=" << mib << "m none $mnt || exit 99\n"
        << "train() { " << SPOTRAIN_BIN
        << " train --model resnet20 --data synthetic --train-limit 4096 --test-limit 16"
           " --batch-size 16 --threads 1 --log-every 1 --ckpt-dir $mnt/run \"$@\"; }\n"
        << "report() { for f in $mnt/run/ckpt-*; do case $f in *.h5) " << SPOTRAIN_BIN
        << " ckpt verify $f > /dev/null 2>&1; echo \"VERIFY $(basename $f) $?\";; *) echo \"LEFT "
           "$(basename $f)\";; esac; done; }\n"
        << "wait_for() { for i in $(seq 1 600); do grep -qsF -e \"$1\" $log && return 0; sleep 0.05; done; return 1; }\n"
        << body << "\n";
    return run_command("timeout -k 5 300 unshare --mount --propagation private sh " + script.string());
  }

  fs::path dir_;
};

// Every checkpoint left verifies and (unless `partial_ok`) no partial file is left.
void expect_all_intact(const std::string& out, bool partial_ok = false) {
  EXPECT_GE(count(out, "VERIFY ckpt-"), 1) << out;
  EXPECT_EQ(count(out, ".h5 1"), 0) << "a checkpoint does not verify:\n" << out;
  if (!partial_ok) {
    EXPECT_FALSE(contains(out, "LEFT ")) << "a partial file was left:\n" << out;
  }
}

// A run that met a failing folder: it ended (RC1) with exit 1 and exactly one error line,
// matching `error`; the resume after the folder was mended (RC2) finished.
void expect_one_error_then_resumed(const CommandResult& r, const std::string& error) {
  ASSERT_NE(r.code, 99) << r.out;
  EXPECT_TRUE(contains(r.out, "RC1 1")) << r.out;
  EXPECT_EQ(count(r.out, "error: "), 1) << "one error line:\n" << r.out;
  EXPECT_TRUE(std::regex_search(r.out, std::regex(error))) << r.out;
  EXPECT_TRUE(contains(r.out, "resumed from")) << r.out;
  EXPECT_TRUE(contains(r.out, "RC2 0")) << r.out;
}

// 8 MiB holds three resnet20 checkpoints (2.2 MB each) and not a fourth: with --keep 100 the
// fourth background write (step 8) fills the disk.
TEST_F(CkptFailures, AFullDiskStopsTheRunWithOneErrorAndItResumesOnceThereIsRoom) {
  CommandResult r = in_tmpfs(8,
                             "train --steps 20 --ckpt-every 2 --keep 100 > $log 2>&1; echo \"RC1 $?\"\n"
                             "cat $log; report\n"
                             "mount -o remount,size=64m $mnt\n"
                             "train --steps 20 --ckpt-every 2 --keep 100 --resume auto 2>&1; echo \"RC2 $?\"\n"
                             "report");
  expect_one_error_then_resumed(
      r, "error: checkpoint .*ckpt-00000008.h5 could not be written: the disk is full .*the newest "
         "checkpoint, .*ckpt-00000006.h5, and older ones are intact");
  expect_all_intact(r.out.substr(0, r.out.find("RC2")));
  EXPECT_TRUE(contains(r.out, "VERIFY ckpt-00000020.h5 0")) << r.out;
}

// A folder that turns read-only mid-run (at step 5, a read-only bind mount over it: files
// already open stay writable, as with a filesystem remounted read-only under open logs; the
// next checkpoint is step 6).
TEST_F(CkptFailures, AFolderGoneReadOnlyStopsTheRunAndItResumesOnceWritable) {
  CommandResult r = in_tmpfs(64,
                             "train --steps 400 --ckpt-every 2 > $log 2>&1 &\npid=$!\n"
                             "wait_for 'step 5/' && mount --bind $mnt/run $mnt/run\n"
                             // busy while a write has a file open through the new mount: retry
                             "for i in $(seq 1 200); do mount -o remount,bind,ro $mnt/run 2>/dev/null && break;"
                             " sleep 0.01; done\n"
                             "wait $pid; echo \"RC1 $?\"\numount $mnt/run\ncat $log; report\n"
                             "train --steps 12 --ckpt-every 2 --resume auto 2>&1; echo \"RC2 $?\"\n"
                             "report");
  expect_one_error_then_resumed(r, "error: checkpoint .* could not be written: the folder .* is no longer writable");
  // A write cut off by the folder turning read-only may leave its .tmp (nothing can be
  // removed from a read-only folder); it never takes a checkpoint's name, and the next start
  // removes it.
  expect_all_intact(r.out.substr(0, r.out.find("RC2")), /*partial_ok=*/true);
  expect_all_intact(r.out.substr(r.out.find("RC2")));
}

// --on-ckpt-error continue: the disk filled from step 5 on (files take all but 0.5 MiB) makes a
// write fail with a warning; training goes on, and once the file is removed the next
// checkpoint is written and the run ends normally.
TEST_F(CkptFailures, ContinueTrainsOnThroughAFullDiskAndCheckpointsWhenSpaceReturns) {
  CommandResult r = in_tmpfs(16,
                             "train --steps 400 --ckpt-every 2 --keep 2 --on-ckpt-error continue > $log 2>&1 &\n"
                             "pid=$!\nwait_for 'step 5/'\n"
                             // keep-N frees space after each write: fill what it frees until a write fails
                             "for i in $(seq 1 1500); do grep -qsF 'training goes on' $log && break\n"
                             "  avail=$(df -k --output=avail $mnt | tail -1)\n"
                             "  [ $avail -gt 600 ] && fallocate -l $(( (avail - 512) * 1024 )) $mnt/filler$i 2>/dev/null\n"
                             "  sleep 0.02\ndone\nrm -f $mnt/filler*\n"
                             "wait $pid; echo \"RC1 $?\"\ncat $log; report");
  ASSERT_NE(r.code, 99) << r.out;
  EXPECT_TRUE(contains(r.out, "RC1 0")) << r.out;
  EXPECT_GE(count(r.out, "warning: checkpoint "), 1) << r.out;
  EXPECT_TRUE(contains(r.out, "the disk is full")) << r.out;
  EXPECT_FALSE(contains(r.out, "error: ")) << r.out;
  EXPECT_TRUE(contains(r.out, "VERIFY ckpt-00000400.h5 0")) << r.out;
  expect_all_intact(r.out);
}

}  // namespace
