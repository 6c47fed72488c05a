// All-reduce bandwidth of the MPI Communicator over message sizes, reported the way
// nccl-tests does: algbw = bytes / time, busbw = algbw * 2 (n - 1) / n. Run under mpirun:
//   mpirun -np 2 --oversubscribe build/bench/bench_allreduce
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "comm/communicator.h"

using namespace spotrain;

int main() {
  auto comm = make_communicator("auto");
  int n = comm->size();
  if (comm->rank() == 0)
    std::printf("| bytes | time (us) | algbw (GB/s) | busbw (GB/s) |\n|---:|---:|---:|---:|\n");
  for (int64_t bytes = 4; bytes <= (int64_t(256) << 20); bytes *= 4) {
    int64_t count = bytes / 4;
    std::vector<float> buf(size_t(count), 1.0f);
    int iters = bytes < (1 << 20) ? 50 : bytes < (64 << 20) ? 10 : 3;
    comm->allreduce_sum(buf.data(), count, DType::f32);  // warm-up
    comm->barrier();
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) comm->allreduce_sum(buf.data(), count, DType::f32);
    double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iters;
    double alg = double(bytes) / t / 1e9;
    if (comm->rank() == 0)
      std::printf("| %lld | %.1f | %.3f | %.3f |\n", static_cast<long long>(bytes), t * 1e6, alg,
                  alg * 2.0 * (n - 1) / std::max(1, n));
  }
  return 0;
}
