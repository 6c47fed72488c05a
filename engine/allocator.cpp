// Caching allocator implementation (see allocator.h).
#include "engine/allocator.h"

#include <cstdio>
#include <cstdlib>
#include <new>

#include "engine/error.h"

namespace spotrain {

namespace {
void* host_alloc(size_t bytes) {
  void* p = std::aligned_alloc(64, bytes);
  return p;
}
void host_free(void* p) { std::free(p); }
}  // namespace

Allocator::Allocator(Device device, Raw raw) : device_(device), raw_(raw) {
  if (!raw_.alloc) raw_ = Raw{host_alloc, host_free};
}

Allocator::~Allocator() { release_cached(); }

size_t Allocator::round_size(size_t bytes) {
  if (bytes == 0) bytes = 1;
  // Small blocks to 512 bytes; large ones to 1/8 of their power of two, so reuse works
  // for tensors of slightly different sizes without wasting more than 12.5%.
  if (bytes <= (1u << 20)) return (bytes + 511) & ~size_t(511);
  size_t p = size_t(1) << (63 - __builtin_clzll(bytes));
  size_t step = p / 8;
  return (bytes + step - 1) / step * step;
}

void* Allocator::allocate(size_t bytes) {
  size_t sz = round_size(bytes);
  std::lock_guard<std::mutex> lock(mu_);
  void* p = nullptr;
  auto it = free_.find(sz);
  if (it != free_.end()) {
    p = it->second;
    free_.erase(it);
  } else {
    p = raw_.alloc(sz);
    if (!p) {
      // Give the cache back to the system and try once more before failing.
      for (auto& kv : free_) raw_.free(kv.second);
      for (auto& kv : free_) stats_.reserved_bytes -= kv.first;
      free_.clear();
      p = raw_.alloc(sz);
      if (!p)
        SPOTRAIN_THROW("out of ", device_name(device_), " memory allocating ", sz,
                       " bytes (", stats_.current_bytes,
                       " in use); reduce --batch-size or use --grad-checkpoint");
    }
    stats_.reserved_bytes += sz;
    stats_.system_allocs++;
  }
  stats_.current_bytes += sz;
  if (stats_.current_bytes > stats_.peak_bytes) stats_.peak_bytes = stats_.current_bytes;
  return p;
}

void Allocator::deallocate(void* p, size_t bytes) {
  if (!p) return;
  size_t sz = round_size(bytes);
  std::lock_guard<std::mutex> lock(mu_);
  stats_.current_bytes -= sz;
  free_.emplace(sz, p);
}

void Allocator::release_cached() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& kv : free_) {
    raw_.free(kv.second);
    stats_.reserved_bytes -= kv.first;
  }
  free_.clear();
}

AllocatorStats Allocator::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void Allocator::reset_peak() {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.peak_bytes = stats_.current_bytes;
}

Allocator& Allocator::host() {
  static Allocator* a = new Allocator(Device::cpu);  // lives to process exit
  return *a;
}

}  // namespace spotrain
