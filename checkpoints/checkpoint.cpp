// HDF5 checkpoint writer and reader (see checkpoint.h).
#include "checkpoints/checkpoint.h"

#include <fcntl.h>
#include <hdf5.h>
#include <zlib.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <thread>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>

#include <nlohmann/json.hpp>
#include <vector>

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/environment.h"

#define H5_CHECK(call, what)                                                          \
  ([&]() {                                                                            \
    auto r_ = (call);                                                                 \
    if (r_ < 0) SPOTRAIN_THROW("HDF5 call failed: ", #call, " at ", __FILE__, ":", __LINE__, \
                               " while ", what, hdf5_system_error());                 \
    return r_;                                                                        \
  }())

namespace spotrain {

namespace {

// The operating system's reason behind the HDF5 call that just failed, as ": <strerror>"
// (HDF5's file drivers put "error message = '...'" on the error stack when a read or write
// fails, e.g. "No space left on device"), or "" when the failure was HDF5's own.
std::string hdf5_system_error() {
  std::string reason;
  auto visit = [](unsigned, const H5E_error2_t* err, void* out) -> herr_t {
    const char* key = "error message = '";
    const char* at = err->desc ? std::strstr(err->desc, key) : nullptr;
    auto& found = *static_cast<std::string*>(out);
    if (at && found.empty()) {
      at += std::strlen(key);
      const char* end = std::strchr(at, '\'');
      found.assign(at, end ? end : at + std::strlen(at));
    }
    return 0;
  };
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, visit, &reason);
  return reason.empty() ? std::string() : ": " + reason;
}

// Owns one HDF5 identifier and closes it with the right function.
class H5Id {
 public:
  H5Id(hid_t id, herr_t (*close)(hid_t)) : id_(id), close_(close) {}
  ~H5Id() {
    if (id_ >= 0) close_(id_);
  }
  H5Id(const H5Id&) = delete;
  H5Id& operator=(const H5Id&) = delete;
  operator hid_t() const { return id_; }

 private:
  hid_t id_;
  herr_t (*close_)(hid_t);
};

void quiet_hdf5() { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); }

// A file whose close failed (a full disk cannot take the last metadata) stays in HDF5's list
// of open files, and the library's own clean-up at exit crashes on it (H5F__close_cb under
// H5_term_library). The temporary is removed and the error reported before then, so the
// process skips that clean-up: this runs before main, ahead of any other HDF5 call.
const bool kNoHdf5AtExit = (H5dont_atexit(), true);

void write_string_attr(hid_t obj, const char* name, const std::string& value) {
  H5Id type(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(type, value.size() + 1);
  H5Tset_strpad(type, H5T_STR_NULLTERM);
  H5Id space(H5Screate(H5S_SCALAR), H5Sclose);
  H5Id attr(H5_CHECK(H5Acreate2(obj, name, type, space, H5P_DEFAULT, H5P_DEFAULT), name), H5Aclose);
  H5_CHECK(H5Awrite(attr, type, value.c_str()), name);
}

void write_int_attr(hid_t obj, const char* name, int64_t v) {
  H5Id space(H5Screate(H5S_SCALAR), H5Sclose);
  H5Id attr(H5_CHECK(H5Acreate2(obj, name, H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT), name),
            H5Aclose);
  H5_CHECK(H5Awrite(attr, H5T_NATIVE_INT64, &v), name);
}

void write_double_attr(hid_t obj, const char* name, double v) {
  H5Id space(H5Screate(H5S_SCALAR), H5Sclose);
  H5Id attr(H5_CHECK(H5Acreate2(obj, name, H5T_IEEE_F64LE, space, H5P_DEFAULT, H5P_DEFAULT), name),
            H5Aclose);
  H5_CHECK(H5Awrite(attr, H5T_NATIVE_DOUBLE, &v), name);
}

// The attribute `name` of `obj`, opened, of type class `want` (H5T_INTEGER, H5T_FLOAT,
// H5T_STRING; a number may be either of the first two): a file whose attribute is missing or of
// another kind is refused naming the file and the attribute, not with HDF5's error stack.
hid_t open_attr(hid_t obj, const char* name, const std::string& path, H5T_class_t want) {
  if (H5Aexists(obj, name) <= 0) SPOTRAIN_THROW("checkpoint ", path, " has no '", name, "' attribute");
  const hid_t attr = H5Aopen(obj, name, H5P_DEFAULT);
  SPOTRAIN_CHECK(attr >= 0, "checkpoint ", path, ": attribute '", name, "' cannot be opened (corrupt file?)");
  const hid_t type = H5Aget_type(attr);
  const H5T_class_t cls = type >= 0 ? H5Tget_class(type) : H5T_NO_CLASS;
  if (type >= 0) H5Tclose(type);
  const bool number = want != H5T_STRING;
  if (number ? (cls != H5T_INTEGER && cls != H5T_FLOAT) : cls != H5T_STRING) {
    H5Aclose(attr);
    SPOTRAIN_THROW("checkpoint ", path, ": attribute '", name, "' is ",
                   cls == H5T_STRING ? "a string" : "not a string", " where a ",
                   number ? "number" : "string", " belongs (written by another tool, or damaged?)");
  }
  return attr;
}

double read_double_attr(hid_t obj, const char* name, const std::string& path) {
  H5Id attr(open_attr(obj, name, path, H5T_FLOAT), H5Aclose);
  double v = 0;
  H5_CHECK(H5Aread(attr, H5T_NATIVE_DOUBLE, &v), name);
  return v;
}

std::string read_string_attr(hid_t obj, const char* name, const std::string& path) {
  H5Id attr(open_attr(obj, name, path, H5T_STRING), H5Aclose);
  H5Id type(H5Aget_type(attr), H5Tclose);
  size_t n = H5Tget_size(type);
  if (n == 0 || n > (size_t(64) << 20))
    SPOTRAIN_THROW("checkpoint ", path, ": attribute '", name, "' declares ", n, " bytes (corrupt file?)");
  // Room for a terminator: strings written by other tools (h5py) are null-padded, not
  // null-terminated, and converting them to an n-byte terminated type would cut one char.
  std::vector<char> buf(n + 2, 0);
  H5Id mem(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(mem, n + 1);
  H5_CHECK(H5Aread(attr, mem, buf.data()), name);
  return std::string(buf.data());
}

int64_t read_int_attr(hid_t obj, const char* name, const std::string& path) {
  H5Id attr(open_attr(obj, name, path, H5T_INTEGER), H5Aclose);
  int64_t v = 0;
  H5_CHECK(H5Aread(attr, H5T_NATIVE_INT64, &v), name);
  return v;
}

// A checkpoint is one self-contained file: every link in it is a hard link (an external link
// would open another file, a soft link point anywhere) and every dataset keeps its bytes in
// this file (no external raw storage, no virtual dataset mapping other files). Checked on
// every open, before any tensor is read.
herr_t refuse_foreign_link(hid_t group, const char* name, const H5L_info_t* info, void* op) {
  auto* why = static_cast<std::string*>(op);
  if (info->type != H5L_TYPE_HARD) {
    *why = str("'", name, "' is an ", info->type == H5L_TYPE_EXTERNAL ? "external" : "soft",
               " link (a checkpoint must be one self-contained file)");
    return 1;  // stop the walk
  }
  H5Id obj(H5Oopen(group, name, H5P_DEFAULT), H5Oclose);
  if (obj < 0) {
    *why = str("object '", name, "' cannot be opened");
    return 1;
  }
  if (H5Iget_type(obj) != H5I_DATASET) return 0;
  H5Id dcpl(H5Dget_create_plist(obj), H5Pclose);
  if (H5Pget_external_count(dcpl) != 0 || H5Pget_layout(dcpl) == H5D_VIRTUAL) {
    *why = str("dataset '", name, "' keeps its bytes in another file (a checkpoint must be one "
               "self-contained file)");
    return 1;
  }
  return 0;
}

// Opens a checkpoint for reading: a regular file (a FIFO or a device would block or never
// end), HDF5, and self-contained (above). Throws Error naming the file otherwise.
struct OpenCheckpoint {
  H5Id file;
  uint64_t bytes;
};

std::unique_ptr<OpenCheckpoint> open_checkpoint(const std::string& path) {
  namespace fs = std::filesystem;
  quiet_hdf5();
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (!fs::exists(st)) SPOTRAIN_THROW("checkpoint ", path, " does not exist");
  if (!fs::is_regular_file(st)) SPOTRAIN_THROW("checkpoint ", path, " is not a regular file");
  const uint64_t bytes = fs::file_size(path, ec);
  if (H5Fis_hdf5(path.c_str()) <= 0)
    SPOTRAIN_THROW("checkpoint ", path, " is not an HDF5 file (truncated or corrupt?)");
  std::unique_ptr<OpenCheckpoint> c(
      new OpenCheckpoint{H5Id(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose), bytes});
  if (c->file < 0) SPOTRAIN_THROW("cannot open checkpoint ", path, " (truncated or corrupt?)");
  std::string why;
  if (H5Lvisit(c->file, H5_INDEX_NAME, H5_ITER_INC, refuse_foreign_link, &why) != 0 || !why.empty())
    SPOTRAIN_THROW("checkpoint ", path, ": ", why.empty() ? "its links cannot be listed (corrupt file?)" : why);
  return c;
}

// Elements of a dataset, checked against the file's size before anything is allocated for it
// (a crafted header can declare any number).
int64_t stored_elements(hid_t ds, uint64_t file_bytes, const std::string& path, const std::string& name) {
  H5Id space(H5Dget_space(ds), H5Sclose);
  const hssize_t n = H5Sget_simple_extent_npoints(space);
  if (n < 0 || uint64_t(n) > file_bytes / 4)
    SPOTRAIN_THROW("checkpoint ", path, ": tensor '", name, "' declares ", int64_t(n),
                   " elements, more than the file's ", file_bytes, " bytes hold (corrupt file?)");
  return int64_t(n);
}

uint32_t crc_of(const void* p, size_t bytes) {
  return uint32_t(crc32(0L, static_cast<const Bytef*>(p), uInt(bytes)));
}

// Each dataset carries the CRC-32 of its fp32 little-endian bytes as attribute "crc32".
void write_dataset(hid_t group, const std::string& name, const Tensor& host) {
  std::vector<hsize_t> dims(host.shape().begin(), host.shape().end());
  H5Id space(H5Screate_simple(int(dims.size()), dims.data(), nullptr), H5Sclose);
  H5Id ds(H5_CHECK(H5Dcreate2(group, name.c_str(), H5T_IEEE_F32LE, space, H5P_DEFAULT, H5P_DEFAULT,
                              H5P_DEFAULT), name),
          H5Dclose);
  H5_CHECK(H5Dwrite(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, host.raw()), name);
  write_int_attr(ds, "crc32", crc_of(host.raw(), size_t(host.numel()) * 4));
}


}  // namespace

namespace {
// SPOTRAIN_CKPT_WRITE_DELAY (core/environment.h): pauses a write half way.
void write_delay_hook(int64_t step) {
  const TestHooks& h = test_hooks();
  if (h.ckpt_write_delay <= 0 || step < h.ckpt_write_delay_from_step) return;
  std::this_thread::sleep_for(std::chrono::duration<double>(h.ckpt_write_delay));
}
}  // namespace

std::string checkpoint_path(const std::string& dir, int64_t step) {
  char name[32];
  std::snprintf(name, sizeof name, "ckpt-%08lld.h5", static_cast<long long>(step));
  return dir + "/" + name;
}

void write_checkpoint_file(const std::string& path, const CheckpointSnapshot& snap,
                           const std::string& tmp_name) {
  if (snap.wait_copies) snap.wait_copies();
  quiet_hdf5();
  namespace fs = std::filesystem;
  const CheckpointInfo& info = snap.info;
  fs::path p(path);
  if (p.has_parent_path()) fs::create_directories(p.parent_path());
  const std::string tmp = tmp_name.empty() ? path + ".tmp" : tmp_name;  // the writer's own
  try {
    H5Id file(H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), H5Fclose);
    if (file < 0) SPOTRAIN_THROW("cannot create checkpoint ", tmp, ": check the directory is writable");
    write_int_attr(file, "format_version", kCheckpointFormatVersion);
    write_string_attr(file, "engine_version", "spotrain 0.1.0");
    std::time_t now = std::time(nullptr);
    char ts[64];
    std::strftime(ts, sizeof ts, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
    write_string_attr(file, "created", ts);
    write_string_attr(file, "config", info.config_json);
    write_string_attr(file, "model", info.model);
    write_int_attr(file, "epoch", info.epoch);
    write_int_attr(file, "global_step", info.global_step);
    write_int_attr(file, "batch_in_epoch", info.batch_in_epoch);
    write_int_attr(file, "samples_in_epoch", info.samples_in_epoch);
    write_int_attr(file, "global_batch", info.global_batch);
    write_int_attr(file, "world_size", info.world_size);
    write_int_attr(file, "seed", int64_t(info.seed));
    write_int_attr(file, "num_classes", info.num_classes);
    write_int_attr(file, "in_channels", info.in_channels);
    write_string_attr(file, "precision", info.precision);
    {
      H5Id sg(H5Gcreate2(file, "loss_scaler", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose);
      write_double_attr(sg, "scale", info.scaler.scale);
      write_int_attr(sg, "good_steps", info.scaler.good_steps);
      write_int_attr(sg, "skipped_steps", info.scaler.skipped_steps);
      write_int_attr(sg, "consecutive_overflows", info.scaler.consecutive_overflows);
    }
    write_delay_hook(info.global_step);
    H5Id g(H5Gcreate2(file, "model", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose);
    for (auto& [name, t] : snap.model) write_dataset(g, name, t);
    if (snap.optimizer.steps >= 0) {
      const OptimizerRecord& o = snap.optimizer;
      H5Id og(H5Gcreate2(file, "optimizer", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose);
      write_int_attr(og, "steps", o.steps);
      write_string_attr(og, "kind", o.kind);
      if (o.kind == "lars") {
        write_double_attr(og, "lars_trust", o.lars_trust);
        write_double_attr(og, "lars_epsilon", o.lars_epsilon);
      }
      write_double_attr(og, "momentum", o.momentum);
      write_int_attr(og, "nesterov", o.nesterov ? 1 : 0);
      write_double_attr(og, "weight_decay", o.weight_decay);
      write_int_attr(og, "decay_bn_and_bias", o.decay_bn_and_bias ? 1 : 0);
      H5Id mg(H5Gcreate2(og, "momentum", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose);
      for (auto& [name, t] : snap.momentum) write_dataset(mg, name, t);
    }
    if (!snap.ema.empty()) {
      H5Id eg(H5Gcreate2(file, "ema", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose);
      for (auto& [name, t] : snap.ema) write_dataset(eg, name, t);
    }
    H5_CHECK(H5Fflush(file, H5F_SCOPE_GLOBAL), "flushing the checkpoint (disk full?)");
  } catch (...) {
    std::error_code ec;
    fs::remove(tmp, ec);  // never leave a half file behind; older checkpoints are untouched
    throw;
  }
  // Read back whole before it takes its name: a file under a checkpoint's name was verified
  // once, so a reader in another process (a resume, another writer's scan) never meets a bad one.
  try {
    verify_checkpoint(tmp, nullptr);
  } catch (const std::exception& e) {
    std::error_code ec;
    fs::remove(tmp, ec);
    SPOTRAIN_THROW("the checkpoint written for ", path, " does not read back (", e.what(),
                   "); the checkpoints before it are untouched");
  }
  commit_file(tmp, path, "the checkpoint");
}

namespace {
// The record of an open checkpoint (see read_checkpoint_info).
CheckpointInfo info_of(hid_t file, const std::string& path) {
  CheckpointInfo info;
  info.format_version = int(read_int_attr(file, "format_version", path));
  if (info.format_version < 1 || info.format_version > kCheckpointFormatVersion)
    SPOTRAIN_THROW("checkpoint ", path, " has format version ", info.format_version,
                   "; this build reads versions 1 to ", kCheckpointFormatVersion);
  info.config_json = read_string_attr(file, "config", path);
  info.model = read_string_attr(file, "model", path);
  info.epoch = read_int_attr(file, "epoch", path);
  info.global_step = read_int_attr(file, "global_step", path);
  info.batch_in_epoch = read_int_attr(file, "batch_in_epoch", path);
  auto optional_int = [&](const char* name) {
    return H5Aexists(file, name) > 0 ? read_int_attr(file, name, path) : int64_t(0);
  };
  info.samples_in_epoch = optional_int("samples_in_epoch");
  info.global_batch = optional_int("global_batch");
  info.world_size = int(optional_int("world_size"));
  info.seed = uint64_t(optional_int("seed"));
  info.num_classes = int(read_int_attr(file, "num_classes", path));
  info.in_channels = int(read_int_attr(file, "in_channels", path));
  info.precision = read_string_attr(file, "precision", path);
  if (H5Lexists(file, "loss_scaler", H5P_DEFAULT) > 0) {
    H5Id sg(H5Gopen2(file, "loss_scaler", H5P_DEFAULT), H5Gclose);
    info.scaler.scale = read_double_attr(sg, "scale", path);
    info.scaler.good_steps = read_int_attr(sg, "good_steps", path);
    info.scaler.skipped_steps = read_int_attr(sg, "skipped_steps", path);
    info.scaler.consecutive_overflows = read_int_attr(sg, "consecutive_overflows", path);
  }
  if (H5Lexists(file, "optimizer", H5P_DEFAULT) > 0) {
    H5Id og(H5Gopen2(file, "optimizer", H5P_DEFAULT), H5Gclose);
    info.optimizer_steps = read_int_attr(og, "steps", path);
    SPOTRAIN_CHECK(info.optimizer_steps >= 0, "checkpoint ", path, " records ", info.optimizer_steps,
                   " optimizer steps (corrupt file?)");
    if (H5Aexists(og, "kind") > 0) info.optimizer_kind = read_string_attr(og, "kind", path);
  }
  // What the training position and the model are built from, in range before anyone uses it.
  auto in_range = [&](const char* what, int64_t v, int64_t lo, int64_t hi) {
    SPOTRAIN_CHECK(v >= lo && v <= hi, "checkpoint ", path, " records ", what, " ", v, ", outside [", lo, ", ",
                   hi, "] (corrupt or crafted file)");
  };
  const int64_t big = int64_t(1) << 53;
  in_range("global_step", info.global_step, 0, big);
  in_range("epoch", info.epoch, 0, big);
  in_range("batch_in_epoch", info.batch_in_epoch, 0, big);
  in_range("samples_in_epoch", info.samples_in_epoch, 0, big);
  in_range("global_batch", info.global_batch, 0, int64_t(1) << 31);
  in_range("world_size", info.world_size, 0, int64_t(1) << 24);
  in_range("num_classes", info.num_classes, 1, int64_t(1) << 20);
  in_range("in_channels", info.in_channels, 1, 64);
  return info;
}

// Whether `group` ("ema", "optimizer/momentum") is in the file: each level of its path in turn
// (H5Lexists on a path whose parent is missing fails rather than answering no).
bool has_group(hid_t file, const std::string& group) {
  return H5Lexists(file, group.substr(0, group.find('/')).c_str(), H5P_DEFAULT) > 0 &&
         H5Lexists(file, group.c_str(), H5P_DEFAULT) > 0;
}

// A dataset's shape.
Shape shape_of(hid_t ds) {
  H5Id space(H5Dget_space(ds), H5Sclose);
  const int nd = H5Sget_simple_extent_ndims(space);
  std::vector<hsize_t> dims(size_t(std::max(nd, 0)));
  H5Sget_simple_extent_dims(space, dims.data(), nullptr);
  return Shape(dims.begin(), dims.end());
}

// Calls f(name, dataset, shape) for each tensor of `group` (which must exist), in name order.
template <class F>
void for_each_tensor(const OpenCheckpoint& c, const std::string& path, const std::string& group, F&& f) {
  H5Id g(H5Gopen2(c.file, group.c_str(), H5P_DEFAULT), H5Gclose);
  SPOTRAIN_CHECK(g >= 0, "checkpoint ", path, ": '", group, "' is not a group of tensors (corrupt file?)");
  H5G_info_t gi;
  SPOTRAIN_CHECK(H5Gget_info(g, &gi) >= 0, "checkpoint ", path, ": cannot list the tensors of ", group,
                 " (corrupt file?)");
  for (hsize_t i = 0; i < gi.nlinks; ++i) {
    char name[512];
    SPOTRAIN_CHECK(H5Lget_name_by_idx(g, ".", H5_INDEX_NAME, H5_ITER_INC, i, name, sizeof name, H5P_DEFAULT) > 0,
                   "checkpoint ", path, ": cannot list the tensors of ", group, " (corrupt file?)");
    H5Id ds(H5Dopen2(g, name, H5P_DEFAULT), H5Dclose);
    SPOTRAIN_CHECK(ds >= 0, "checkpoint ", path, ": '", group, "/", name, "' is not a tensor");
    f(std::string(name), hid_t(ds), shape_of(ds));
  }
}

}  // namespace

CheckpointInfo read_checkpoint_info(const std::string& path) {
  return info_of(open_checkpoint(path)->file, path);
}

void read_checkpoint_tensors(const std::string& path, const std::string& group, NamedTensors& into) {
  const auto opened = open_checkpoint(path);
  const hid_t file = opened->file;
  info_of(file, path);  // validates the record and its version
  if (!has_group(file, group))
    SPOTRAIN_THROW("checkpoint ", path, " has no ", group,
                   group == "model" ? " tensors"
                   : group == "ema" ? " weights (it was trained without --ema-decay)"
                                    : " (no optimizer state: it cannot resume training)");
  for (auto& [name, dst] : into) {
    std::string dname = group + "/" + name;
    if (H5Lexists(file, dname.c_str(), H5P_DEFAULT) <= 0)
      SPOTRAIN_THROW("checkpoint ", path, " has no tensor '", name, "' (another model's checkpoint?)");
    H5Id ds(H5Dopen2(file, dname.c_str(), H5P_DEFAULT), H5Dclose);
    const Shape s = shape_of(ds);
    if (s != dst.shape())
      SPOTRAIN_THROW("checkpoint ", path, ": tensor '", name, "' has shape ", shape_str(s),
                     ", the model expects ", shape_str(dst.shape()));
    SPOTRAIN_CHECK(dst.device() == Device::cpu && dst.dtype() == DType::f32,
                   "internal: checkpoint tensors are read into host fp32 tensors");
    if (H5Dread(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, dst.write_raw()) < 0)
      SPOTRAIN_THROW("checkpoint ", path, ": cannot read tensor '", name, "' (corrupt file?)");
    if (H5Aexists(ds, "crc32") > 0 &&
        uint32_t(read_int_attr(ds, "crc32", path)) != crc_of(dst.raw(), size_t(dst.numel()) * 4))
      SPOTRAIN_THROW("checkpoint ", path, ": tensor '", name,
                     "' fails its checksum (the file is corrupt)");
  }
}

std::map<std::string, Shape> checkpoint_tensor_shapes(const std::string& path, const std::string& group) {
  const auto opened = open_checkpoint(path);
  info_of(opened->file, path);
  SPOTRAIN_CHECK(has_group(opened->file, group), "checkpoint ", path, " has no ", group, " tensors");
  std::map<std::string, Shape> out;
  for_each_tensor(*opened, path, group, [&](const std::string& name, hid_t, const Shape& shape) {
    out[name] = shape;
  });
  return out;
}

bool checkpoint_has_group(const std::string& path, const std::string& group) {
  const auto opened = open_checkpoint(path);
  const hid_t file = opened->file;
  info_of(file, path);
  return has_group(file, group);
}

void verify_checkpoint(const std::string& path, CheckpointInfo* info_out, const ExpectTensors& expect) {
  const auto opened = open_checkpoint(path);
  const hid_t file = opened->file;
  CheckpointInfo info = info_of(file, path);
  auto cfg = nlohmann::json::parse(info.config_json, nullptr, false);
  SPOTRAIN_CHECK(cfg.is_object(), "checkpoint ", path, " has an unreadable run config");
  std::map<std::string, Shape> held[3];  // per group below: every tensor's name and shape
  const char* groups[3] = {"model", "optimizer/momentum", "ema"};
  for (int gi_ = 0; gi_ < 3; ++gi_) {
    const char* group = groups[gi_];
    if (!has_group(file, group)) {
      SPOTRAIN_CHECK(std::string(group) != "model", "checkpoint ", path, " has no model tensors");
      continue;
    }
    for_each_tensor(*opened, path, group, [&](const std::string& name, hid_t ds, const Shape& shape) {
      held[gi_][name] = shape;
      const int64_t n = stored_elements(ds, opened->bytes, path, str(group, "/", name));
      std::vector<float> buf(static_cast<size_t>(n));
      if (H5Dread(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf.data()) < 0)
        SPOTRAIN_THROW("checkpoint ", path, ": cannot read tensor '", group, "/", name,
                       "' (corrupt file?)");
      SPOTRAIN_CHECK(H5Aexists(ds, "crc32") > 0, "checkpoint ", path, ": tensor '", name,
                     "' has no checksum");
      SPOTRAIN_CHECK(uint32_t(read_int_attr(ds, "crc32", path)) == crc_of(buf.data(), buf.size() * 4),
                     "checkpoint ", path, ": tensor '", group, "/", name,
                     "' fails its checksum (the file is corrupt)");
    });
  }
  if (expect) {  // what a resume (or an evaluation) of it will read
    ExpectedTensors want;
    try {
      want = expect(info);
    } catch (const Error& e) {  // about the file's content: name the file
      SPOTRAIN_THROW("checkpoint ", path, ": ", e.what());
    }
    auto need = [&](int g, const std::vector<std::pair<std::string, Shape>>& list) {
      for (const auto& [name, shape] : list) {
        auto it = held[g].find(name);
        SPOTRAIN_CHECK(it != held[g].end(), "checkpoint ", path, " has no tensor '", groups[g], "/", name,
                       "' that its model (", info.model, ") needs");
        SPOTRAIN_CHECK(it->second == shape, "checkpoint ", path, ": tensor '", groups[g], "/", name,
                       "' has shape ", shape_str(it->second), ", its model (", info.model, ") has ",
                       shape_str(shape));
      }
    };
    need(0, want.model);
    SPOTRAIN_CHECK(!want.need_optimizer || info.optimizer_steps >= 0, "checkpoint ", path,
                   " has no optimizer state: it cannot resume training");
    if (info.optimizer_steps >= 0) need(1, want.momentum);
    if (!held[2].empty()) need(2, want.model);
  }
  if (info_out) *info_out = info;
}

std::vector<std::string> list_checkpoints(const std::string& dir) {
  namespace fs = std::filesystem;
  std::vector<std::string> names;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return {};
  for (auto& e : fs::directory_iterator(dir, ec)) {
    auto n = e.path().filename().string();
    if (n.rfind("ckpt-", 0) == 0 && e.path().extension() == ".h5") names.push_back(n);
  }
  std::sort(names.rbegin(), names.rend());  // newest first: the name holds the step
  for (auto& n : names) n = (fs::path(dir) / n).string();
  return names;
}

std::string newest_good_checkpoint(const std::string& dir, const ExpectTensors& expect,
                                   std::vector<std::string>* skipped) {
  // The newest file that verifies. Not `latest` first: with several writers of one folder, or
  // copies on several disks, a newer good file can be there that `latest` does not name yet.
  for (auto& path : list_checkpoints(dir)) {
    try {
      verify_checkpoint(path, nullptr, expect);
      return path;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "warning: skipping unusable checkpoint: %s; trying an older one\n",
                   e.what());
      if (skipped) skipped->push_back(e.what());
    }
  }
  return "";
}

std::string skipped_checkpoints_text(const std::vector<std::string>& skipped) {
  if (skipped.empty()) return "";
  return str("; ", skipped.size(), " unusable checkpoint(s) skipped, the newest: ", skipped.front());
}

int move_checkpoints_after(const std::string& dir, int64_t step, const std::string& to) {
  namespace fs = std::filesystem;
  const std::string after = fs::path(checkpoint_path(dir, step)).filename().string();
  int moved = 0;
  for (auto& path : list_checkpoints(dir)) {
    const fs::path p(path);
    if (p.filename().string() <= after) break;  // newest first; names sort as steps do
    std::error_code ec;
    fs::create_directories(fs::path(dir) / to, ec);
    fs::rename(p, fs::path(dir) / to / p.filename(), ec);
    SPOTRAIN_CHECK(!ec, "cannot move ", path, " to ", dir, "/", to, ": ", ec.message());
    ++moved;
  }
  return moved;
}

void finish_checkpoint(const std::string& path, int keep) {
  namespace fs = std::filesystem;
  fs::path p(path);
  fs::path dir = p.has_parent_path() ? p.parent_path() : fs::path(".");
  // Two writers in this process (the background writer, a survivor's save) compare and move
  // `latest` one at a time; other processes' writes land whole (write_file_atomic).
  static std::mutex latest_mu;
  std::lock_guard<std::mutex> lock(latest_mu);
  std::ifstream current(dir / "latest");
  std::string named;
  std::getline(current, named);
  // Names sort as steps do (ckpt-%08d.h5): a newer one that is there stays `latest`.
  const bool newer_there = named.rfind("ckpt-", 0) == 0 && named > p.filename().string() &&
                           fs::exists(dir / named);
  if (!newer_there)
    write_file_atomic((dir / "latest").string(), p.filename().string() + "\n",
                      "the checkpoint pointer");
  if (keep <= 0) return;
  std::error_code ec;
  auto all = list_checkpoints(dir.string());
  for (size_t i = size_t(keep); i < all.size(); ++i)
    if (all[i] != path) fs::remove(all[i], ec);
}

}  // namespace spotrain
