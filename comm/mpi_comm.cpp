// The MPI Communicator (OpenMPI, host buffers). MPI is initialized with
// MPI_THREAD_SERIALIZED: the CommWorker thread makes the collective calls.
#define OMPI_SKIP_MPICXX 1  // the C API only; no deprecated C++ bindings
#include <mpi.h>

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <thread>

#include "comm/communicator.h"
#include "core/error.h"
#include "core/half.h"

#define MPI_CHECK(call)                                                       \
  do {                                                                        \
    int mpi_rc_ = (call);                                                     \
    if (mpi_rc_ != MPI_SUCCESS) {                                             \
      char msg_[MPI_MAX_ERROR_STRING];                                        \
      int len_ = 0;                                                           \
      MPI_Error_string(mpi_rc_, msg_, &len_);                                 \
      SPOTRAIN_THROW("MPI call failed: ", #call, " at ", __FILE__, ":", __LINE__, \
                     ": ", std::string(msg_, size_t(len_)));                   \
    }                                                                         \
  } while (0)

namespace spotrain {

std::unique_ptr<Communicator> make_local_communicator();

namespace {

// True when /proc/PID/comm (path given) names Open MPI's daemon. Async-signal-safe.
bool names_orted(const char* comm_path) {
  char name[16] = {0};
  int fd = open(comm_path, O_RDONLY);
  if (fd < 0) return false;
  ssize_t n = read(fd, name, sizeof name - 1);
  close(fd);
  return n >= 5 && std::strncmp(name, "orted", 5) == 0 && (name[5] == '\n' || name[5] == 0);
}

// Open MPI's daemon on this node (the `orted` that started this rank) forwards an abort to
// mpirun; when mpirun's node is unreachable it cannot, and lingers with nothing left to do
// until TCP gives up (about 15 minutes). A detached child of ours ends it if it is still there
// 10 s after the abort: by then a reachable mpirun has ended the job and the daemon with it.
// (Only a parent named orted: not mpirun's own node, not srun, not a plain process.)
void end_daemon_if_stranded() {
  const pid_t daemon = getppid();
  char comm_path[64];
  std::snprintf(comm_path, sizeof comm_path, "/proc/%d/comm", int(daemon));
  if (!names_orted(comm_path)) return;
  if (fork() != 0) return;  // the rank goes on to abort (or fork failed: nothing to do)
  // The child: async-signal-safe calls only. Its own session, so the daemon's kill of this
  // rank's process group misses it; no inherited descriptors, so the daemon does not wait for
  // this child's end of the rank's output pipes.
  setsid();
  for (int fd = 0; fd < 1024; ++fd) close(fd);
  struct timespec ts = {10, 0};
  while (nanosleep(&ts, &ts) != 0) {
  }
  if (names_orted(comm_path)) kill(daemon, SIGTERM);
  _exit(0);
}

// Sums 16-bit floats element by element in fp32 (an MPI user operation).
template <float (*Load)(uint16_t), uint16_t (*Store)(float)>
void sum16(void* in, void* inout, int* len, MPI_Datatype*) {
  auto* a = static_cast<const uint16_t*>(in);
  auto* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = Store(Load(a[i]) + Load(b[i]));
}

// Open MPI's runtime notices a host that left the network only through its out-of-band TCP
// keepalive (defaults 300 s, then 9 probes 20 s apart): until then `mpirun` and the other hosts'
// daemons stay up although the ranks have ended, and a restart loop waits minutes. The
// project's launcher sets it; a job started with plain `mpirun` across hosts is told once.
void warn_of_default_keepalive() {
  const char* nodes = std::getenv("OMPI_MCA_orte_num_nodes");
  if (!nodes || std::atoi(nodes) < 2) return;  // one host: no network between the ranks
  const char* ka = std::getenv("OMPI_MCA_oob_tcp_keepalive_time");
  if (ka && std::atoi(ka) > 0 && std::atoi(ka) <= 60) return;
  std::fprintf(stderr,
               "warning: Open MPI's runtime keepalive is %s: a host lost from the network leaves mpirun "
               "running for up to %s before the job returns; launch with examples/resnet50/launch/mpirun.sh "
               "(it sets it), or pass mpirun --mca oob_tcp_keepalive_time 5 --mca oob_tcp_keepalive_intvl 2 "
               "--mca oob_tcp_keepalive_probes 3\n",
               ka ? (std::string(ka) + " s").c_str() : "at its default (300 s)", ka ? "that and its probes" : "8 minutes");
}

class MpiComm final : public Communicator {
 public:
  MpiComm() {
    int inited = 0;
    MPI_Initialized(&inited);
    if (!inited) {
      int provided = 0;
      MPI_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided));
      SPOTRAIN_CHECK(provided >= MPI_THREAD_SERIALIZED,
                     "this MPI library does not support MPI_THREAD_SERIALIZED");
      owns_ = true;
    }
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank_));
    MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &size_));
    MPI_Comm node;
    MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node));
    MPI_CHECK(MPI_Comm_rank(node, &local_rank_));
    MPI_Comm_free(&node);
    MPI_CHECK(MPI_Type_contiguous(2, MPI_BYTE, &half_type_));
    MPI_CHECK(MPI_Type_commit(&half_type_));
    MPI_CHECK(MPI_Op_create(&sum16<bf16_to_float, float_to_bf16>, 1, &bf16_sum_));
    MPI_CHECK(MPI_Op_create(&sum16<half_to_float, float_to_half>, 1, &f16_sum_));
    if (rank_ == 0) warn_of_default_keepalive();
  }
  ~MpiComm() override {
    MPI_Op_free(&bf16_sum_);
    MPI_Op_free(&f16_sum_);
    MPI_Type_free(&half_type_);
    int finalized = 0;
    MPI_Finalized(&finalized);
    // Unwinding from an error: MPI_Finalize would wait for ranks that are still training.
    // Exiting without it makes mpirun end the whole job, which is what an error must do.
    if (std::uncaught_exceptions() > 0) return;
    if (owns_ && !finalized) MPI_Finalize();
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int local_rank() const override { return local_rank_; }
  std::string name() const override {
    char v[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    MPI_Get_library_version(v, &len);
    std::string s(v, size_t(len));
    return "mpi (" + s.substr(0, s.find(',')) + ")";
  }
  void allreduce_sum(void* data, int64_t count, DType dt) override {
    // MPI counts are int: large buffers go in chunks.
    const int64_t chunk = int64_t(1) << 30;
    size_t esz = dtype_size(dt);
    for (int64_t off = 0; off < count; off += chunk) {
      int n = int(std::min(chunk, count - off));
      char* p = static_cast<char*>(data) + off * int64_t(esz);
      switch (dt) {
        case DType::f32: MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, p, n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD)); break;
        case DType::bf16: MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, p, n, half_type_, bf16_sum_, MPI_COMM_WORLD)); break;
        case DType::f16: MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, p, n, half_type_, f16_sum_, MPI_COMM_WORLD)); break;
        case DType::i32: MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, p, n, MPI_INT32_T, MPI_SUM, MPI_COMM_WORLD)); break;
        default: SPOTRAIN_THROW("allreduce: unsupported dtype ", dtype_name(dt));
      }
    }
  }
  void broadcast(void* data, size_t bytes, int root) override {
    const size_t chunk = size_t(1) << 30;
    for (size_t off = 0; off < bytes; off += chunk)
      MPI_CHECK(MPI_Bcast(static_cast<char*>(data) + off, int(std::min(chunk, bytes - off)),
                          MPI_BYTE, root, MPI_COMM_WORLD));
  }
  void barrier() override { MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD)); }
  void exchange(int peer, const void* send, void* recv, size_t bytes) override {
    SPOTRAIN_CHECK(peer >= 0 && peer < size_ && peer != rank_, "exchange: no rank ", peer, " to exchange with");
    const size_t chunk = size_t(1) << 30;
    for (size_t off = 0; off < bytes; off += chunk) {
      const int n = int(std::min(chunk, bytes - off));
      MPI_CHECK(MPI_Sendrecv(static_cast<const char*>(send) + off, n, MPI_BYTE, peer, kExchangeTag,
                             static_cast<char*>(recv) + off, n, MPI_BYTE, peer, kExchangeTag,
                             MPI_COMM_WORLD, MPI_STATUS_IGNORE));
    }
  }
  std::vector<uint64_t> allgather(uint64_t v) override {
    std::vector<uint64_t> all(size_t(size_), 0);
    MPI_CHECK(MPI_Allgather(&v, 1, MPI_UINT64_T, all.data(), 1, MPI_UINT64_T, MPI_COMM_WORLD));
    return all;
  }
  // Open MPI ends a job whose node stopped answering once its runtime connections' TCP
  // keepalive gives up: TIME + INTERVAL x PROBES seconds (mpirun passes its --mca settings to
  // the ranks as OMPI_MCA_ variables; 300 + 20 x 9 by default, too long to wait for).
  double runtime_detection_seconds() const override {
    if (!std::getenv("OMPI_COMM_WORLD_SIZE")) return 0;
    auto mca = [](const char* name, double fallback) {
      const char* v = std::getenv(name);
      return v && *v ? std::atof(v) : fallback;
    };
    double s = mca("OMPI_MCA_oob_tcp_keepalive_time", 300) +
               mca("OMPI_MCA_oob_tcp_keepalive_intvl", 20) * mca("OMPI_MCA_oob_tcp_keepalive_probes", 9);
    return s > 0 && s <= 30 ? s + 2 : 0;  // 2 s for the runtime to act on it
  }
  [[noreturn]] void abort(int code) override {
    std::fflush(stdout);
    std::fflush(stderr);
    end_daemon_if_stranded();
    // MPI_Abort hands the end of the job to Open MPI's runtime. When the runtime is ending it
    // already (a rank died), the call waits for the runtime's own kill, which comes two
    // odls_base_sigkill_timeout periods later (after its SIGCONT and its SIGTERM): this rank
    // leaves by itself well before.
    std::thread([code] {
      std::this_thread::sleep_for(std::chrono::seconds(kAbortExitSeconds));
      std::_Exit(code);
    }).detach();
    MPI_Abort(MPI_COMM_WORLD, code);
    std::_Exit(code);
  }
  static constexpr int kAbortExitSeconds = 5;
  static constexpr int kExchangeTag = 0x5107;

 private:
  bool owns_ = false;
  int rank_ = 0, size_ = 1, local_rank_ = 0;
  MPI_Datatype half_type_;
  MPI_Op bf16_sum_, f16_sum_;
};

}  // namespace

std::unique_ptr<Communicator> make_communicator(const std::string& kind) {
  if (kind == "local") return make_local_communicator();
  if (kind == "mpi" || (kind == "auto" && launched_by_mpi())) return std::make_unique<MpiComm>();
  if (kind == "auto") return make_local_communicator();
  SPOTRAIN_THROW("unknown communicator '", kind, "'; use auto, local or mpi");
}

}  // namespace spotrain
