// checkpoints/ in process, without the binary: a snapshot written and read back is the same
// bits and the same record; a changed byte fails its CRC, a newer format version and a
// missing tensor are refused naming them; groups are found; `latest` and keep-N follow each
// finished write, and a corrupt newest file falls back to the previous one; the background
// writer reports a failed write at the next check; CheckpointManager decides when a checkpoint
// is due, names it, and clears half-written leftovers at start.
#include <gtest/gtest.h>
#include <hdf5.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "checkpoints/async_writer.h"
#include "checkpoints/checkpoint.h"
#include "checkpoints/checkpoint_manager.h"
#include "core/error.h"
#include "scratch_dir.h"
#include "core/philox.h"

namespace fs = std::filesystem;
using namespace spotrain;

namespace {

Tensor random_host(const Shape& s, uint64_t seed) {
  Tensor t = Tensor::host(s);
  Philox rng(seed, 5);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = rng.normal();
  return t;
}

// A small snapshot with every part a checkpoint holds.
CheckpointSnapshot sample_snapshot(int64_t step) {
  CheckpointSnapshot s;
  CheckpointInfo& i = s.info;
  i.config_json = R"({"model":"resnet20","lr":0.1})";
  i.model = "resnet20";
  i.epoch = 2;
  i.global_step = step;
  i.batch_in_epoch = 7;
  i.num_classes = 10;
  i.in_channels = 1;
  i.precision = "fp16";
  i.scaler = LossScalerState{1024.0, 17, 3, 1};
  i.global_batch = 64;
  i.world_size = 2;
  i.samples_in_epoch = 7 * 64;
  i.seed = 12345678901ull;
  s.model = {{"conv1.weight", random_host({4, 1, 3, 3}, 1)}, {"bn1.running_mean", random_host({4}, 2)}};
  s.momentum = {{"conv1.weight", random_host({4, 1, 3, 3}, 3)}};
  s.ema = {{"conv1.weight", random_host({4, 1, 3, 3}, 4)}, {"bn1.running_mean", random_host({4}, 5)}};
  s.optimizer.steps = 41;
  s.optimizer.momentum = 0.9f;
  s.optimizer.weight_decay = 5e-4f;
  s.optimizer.nesterov = true;
  return s;
}

// The tensors of `like` read back from `group` of `path`.
NamedTensors read_back(const std::string& path, const std::string& group, const NamedTensors& like) {
  NamedTensors out;
  for (auto& [name, t] : like) out.emplace_back(name, Tensor::host(t.shape()));
  read_checkpoint_tensors(path, group, out);
  return out;
}

void expect_same_bits(const NamedTensors& a, const NamedTensors& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].first, b[i].first);
    ASSERT_EQ(a[i].second.numel(), b[i].second.numel());
    EXPECT_EQ(std::memcmp(a[i].second.raw(), b[i].second.raw(), a[i].second.nbytes()), 0) << a[i].first;
  }
}

// Overwrites dataset `name` of `path` with other values, leaving its CRC attribute as it was.
void corrupt_dataset(const std::string& path, const std::string& name) {
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(f, 0);
  hid_t d = H5Dopen2(f, name.c_str(), H5P_DEFAULT);
  ASSERT_GE(d, 0);
  Tensor other = random_host({4, 1, 3, 3}, 99);
  ASSERT_GE(H5Dwrite(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, other.raw()), 0);
  H5Dclose(d);
  H5Fclose(f);
}

void set_int_attr(const std::string& path, const char* attr, int64_t v) {
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(f, 0);
  hid_t a = H5Aopen(f, attr, H5P_DEFAULT);
  ASSERT_GE(a, 0);
  ASSERT_GE(H5Awrite(a, H5T_NATIVE_INT64, &v), 0);
  H5Aclose(a);
  H5Fclose(f);
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(CheckpointFile, ASnapshotReadsBackBitForBitWithItsRecord) {
  const fs::path d = fresh_dir("spotrain_ckpt_roundtrip");
  const std::string path = (d / "ckpt-00000009.h5").string();
  const CheckpointSnapshot s = sample_snapshot(9);
  write_checkpoint_file(path, s);
  EXPECT_FALSE(fs::exists(path + ".tmp"));
  const CheckpointInfo i = read_checkpoint_info(path);
  EXPECT_EQ(i.format_version, kCheckpointFormatVersion);
  EXPECT_EQ(i.config_json, s.info.config_json);
  EXPECT_EQ(i.model, "resnet20");
  EXPECT_EQ(i.epoch, 2);
  EXPECT_EQ(i.global_step, 9);
  EXPECT_EQ(i.batch_in_epoch, 7);
  EXPECT_EQ(i.samples_in_epoch, 7 * 64);
  EXPECT_EQ(i.global_batch, 64);
  EXPECT_EQ(i.world_size, 2);
  EXPECT_EQ(i.seed, 12345678901ull);
  EXPECT_EQ(i.num_classes, 10);
  EXPECT_EQ(i.in_channels, 1);
  EXPECT_EQ(i.precision, "fp16");
  EXPECT_EQ(i.scaler.scale, 1024.0);
  EXPECT_EQ(i.scaler.good_steps, 17);
  EXPECT_EQ(i.scaler.skipped_steps, 3);
  EXPECT_EQ(i.scaler.consecutive_overflows, 1);
  EXPECT_EQ(i.optimizer_steps, 41);
  expect_same_bits(read_back(path, "model", s.model), s.model);
  expect_same_bits(read_back(path, "optimizer/momentum", s.momentum), s.momentum);
  expect_same_bits(read_back(path, "ema", s.ema), s.ema);
  EXPECT_TRUE(checkpoint_has_group(path, "ema"));
  EXPECT_TRUE(checkpoint_has_group(path, "optimizer/momentum"));
  CheckpointInfo verified;
  verify_checkpoint(path, &verified);
  EXPECT_EQ(verified.global_step, 9);
}

TEST(CheckpointFile, WithoutOptimizerOrAverageThoseGroupsAreAbsent) {
  const fs::path d = fresh_dir("spotrain_ckpt_groups");
  const std::string path = (d / "ckpt-00000001.h5").string();
  CheckpointSnapshot s = sample_snapshot(1);
  s.momentum.clear();
  s.ema.clear();
  s.optimizer = OptimizerRecord{};
  write_checkpoint_file(path, s);
  EXPECT_FALSE(checkpoint_has_group(path, "ema"));
  EXPECT_FALSE(checkpoint_has_group(path, "optimizer/momentum"));
  EXPECT_EQ(read_checkpoint_info(path).optimizer_steps, -1);
  verify_checkpoint(path, nullptr);
}

TEST(CheckpointFile, AChangedTensorFailsItsCrcNamingTheTensor) {
  const fs::path d = fresh_dir("spotrain_ckpt_crc");
  const std::string path = (d / "ckpt-00000002.h5").string();
  const CheckpointSnapshot s = sample_snapshot(2);
  write_checkpoint_file(path, s);
  corrupt_dataset(path, "model/conv1.weight");
  const std::string e = error_of([&] { verify_checkpoint(path, nullptr); });
  EXPECT_NE(e.find("conv1.weight"), std::string::npos) << e;
  EXPECT_NE(e.find("checksum"), std::string::npos) << e;
  const std::string r = error_of([&] { read_back(path, "model", s.model); });
  EXPECT_NE(r.find("conv1.weight"), std::string::npos) << r;
}

TEST(CheckpointFile, ANewerFormatAndAMissingTensorAreRefused) {
  const fs::path d = fresh_dir("spotrain_ckpt_version");
  const std::string path = (d / "ckpt-00000003.h5").string();
  const CheckpointSnapshot s = sample_snapshot(3);
  write_checkpoint_file(path, s);
  NamedTensors more = s.model;
  more.emplace_back("fc.weight", Tensor::host({10, 4}));
  const std::string m = error_of([&] { read_checkpoint_tensors(path, "model", more); });
  EXPECT_NE(m.find("fc.weight"), std::string::npos) << m;
  set_int_attr(path, "format_version", kCheckpointFormatVersion + 1);
  const std::string v = error_of([&] { read_checkpoint_info(path); });
  EXPECT_NE(v.find("format version"), std::string::npos) << v;
  EXPECT_NE(v.find(path), std::string::npos) << v;
}

TEST(CheckpointFolder, LatestAndKeepFollowEachWriteAndACorruptNewestFallsBack) {
  const fs::path d = fresh_dir("spotrain_ckpt_folder");
  for (int64_t step : {10, 20, 30, 40}) {
    const std::string path = (d / str("ckpt-", std::string(8 - std::to_string(step).size(), '0'), step, ".h5")).string();
    write_checkpoint_file(path, sample_snapshot(step));
    finish_checkpoint(path, /*keep=*/2);
  }
  std::vector<std::string> all = list_checkpoints(d.string());
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(fs::path(all[0]).filename(), "ckpt-00000040.h5");
  EXPECT_EQ(fs::path(all[1]).filename(), "ckpt-00000030.h5");
  std::ifstream latest(d / "latest");
  std::string name;
  std::getline(latest, name);
  EXPECT_EQ(name, "ckpt-00000040.h5");
  EXPECT_EQ(newest_good_checkpoint(d.string()), all[0]);
  corrupt_dataset(all[0], "model/conv1.weight");
  EXPECT_EQ(newest_good_checkpoint(d.string()), all[1]);
  fs::remove(all[1]);
  EXPECT_EQ(newest_good_checkpoint(d.string()), "");
}

TEST(AsyncWriter, WritesInTheBackgroundAndReportsAFailureAtTheNextCheck) {
  const fs::path d = fresh_dir("spotrain_ckpt_async");
  AsyncCheckpointWriter w(/*keep=*/3);
  const std::string good = (d / "ckpt-00000005.h5").string();
  w.submit(good, sample_snapshot(5));
  w.wait();
  EXPECT_FALSE(w.busy());
  EXPECT_GT(w.last_write_seconds(), 0.0);
  verify_checkpoint(good, nullptr);
  // A folder that is a file: the write fails on the writer thread, check() says so.
  std::ofstream(d / "not-a-folder") << "x";
  w.submit((d / "not-a-folder" / "ckpt-00000006.h5").string(), sample_snapshot(6));
  w.settle();
  EXPECT_THROW(w.check(), std::exception);
  EXPECT_NO_THROW(w.check()) << "an error is reported once";
  verify_checkpoint(good, nullptr);  // the earlier checkpoint is untouched
}

TEST(CheckpointManager, DecidesWhenACheckpointIsDueAndNamesIt) {
  const fs::path d = fresh_dir("spotrain_ckpt_manager");
  std::ofstream(d / "ckpt-00000007.h5.tmp") << "half a file";
  CheckpointManager m(CheckpointPolicy{d.string(), 2, /*every_steps=*/5, /*every_minutes=*/0, false, ""},
                      /*bytes_each=*/1 << 20);
  EXPECT_FALSE(fs::exists(d / "ckpt-00000007.h5.tmp")) << "a half-written leftover stays";
  EXPECT_EQ(fs::path(m.path_for(1234)).filename(), "ckpt-00001234.h5");
  EXPECT_FALSE(m.due(4, false));
  EXPECT_TRUE(m.due(5, false));
  EXPECT_TRUE(m.due(10, false));
  EXPECT_TRUE(m.due(3, true)) << "every epoch end";
  m.set_every_minutes(1e-6);  // every few microseconds: due at once, whatever the step
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_TRUE(m.due(4, false));
  const std::string p = m.write(5, [] { return sample_snapshot(5); }, /*sync=*/true);
  EXPECT_EQ(fs::path(p).filename(), "ckpt-00000005.h5");
  EXPECT_EQ(m.writes_done(), 1);
  EXPECT_GT(m.last_write_seconds(), 0.0);
  m.set_every_minutes(60);
  EXPECT_FALSE(m.due(4, false)) << "the last write restarted the clock";
  const std::string bg = m.write(10, [] { return sample_snapshot(10); }, /*sync=*/false);
  while (m.writing()) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  m.poll();
  EXPECT_EQ(m.writes_done(), 2);
  EXPECT_EQ(newest_good_checkpoint(d.string()), bg);
}

TEST(CheckpointManager, RefusesAFolderItCannotWrite) {
  const fs::path d = fresh_dir("spotrain_ckpt_manager_bad");
  std::ofstream(d / "file") << "x";
  const std::string e = error_of([&] {
    CheckpointManager m(CheckpointPolicy{(d / "file" / "sub").string(), 2, 0, 0, false, ""}, 1 << 20);
  });
  EXPECT_NE(e.find("not writable"), std::string::npos) << e;
}

// A failed write is named by the system's reason it carried, even when the folder looks
// roomy again by the time it is reported (the partial file removed, other files deleted).
TEST(CheckpointManager, NamesAFailedWriteByTheSystemsReasonFirst) {
  const int64_t mib = 1 << 20, need = 3 * mib;
  const std::string hdf5 = "HDF5 call failed: H5Dwrite(...) while layer1.0.conv1.weight";
  // No space, said by the system, with 50 MiB free now.
  std::string c = checkpoint_failure_cause(hdf5 + ": No space left on device", "/ck", 50 * mib, true, need);
  EXPECT_EQ(c.rfind("the disk is full (the write ran out of space; 50.0 MiB free in /ck now", 0), 0) << c;
  // The same without the reason: the folder looks fine, so the raw message stands.
  EXPECT_EQ(checkpoint_failure_cause(hdf5, "/ck", 50 * mib, true, need), hdf5);
  // Without the reason but with too little room left: the disk is full.
  c = checkpoint_failure_cause(hdf5, "/ck", mib / 2, true, need);
  EXPECT_EQ(c, "the disk is full (0.5 MiB free in /ck, a checkpoint needs 3.0 MiB)");
  // Read-only, said by the system or seen in the folder.
  EXPECT_EQ(checkpoint_failure_cause(hdf5 + ": Read-only file system", "/ck", mib, true, need),
            "the folder /ck is no longer writable (read-only or gone)");
  EXPECT_EQ(checkpoint_failure_cause(hdf5, "/ck", 50 * mib, false, need),
            "the folder /ck is no longer writable (read-only or gone)");
}
