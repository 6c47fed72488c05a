// Caching allocator: one per device. Freed blocks are kept in size-class free lists and
// reused, so a training step allocates nothing from the system after the first steps.
// It reports current and peak bytes in use, the figure `bench` prints as peak memory.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <vector>

#include "engine/dtype.h"

namespace spotrain {

struct AllocatorStats {
  size_t current_bytes = 0;   // bytes handed out and not yet returned
  size_t peak_bytes = 0;      // maximum of current_bytes since the last reset_peak()
  size_t reserved_bytes = 0;  // bytes held from the system (in use + cached)
  size_t system_allocs = 0;   // calls that reached the system allocator
};

class Allocator {
 public:
  // Raw system allocation for this device: host memory (64-byte aligned) by default;
  // a device backend overrides these with its own calls (cudaMalloc / cudaFree).
  struct Raw {
    void* (*alloc)(size_t bytes);
    void (*free)(void* p);
  };
  explicit Allocator(Device device) : Allocator(device, Raw{nullptr, nullptr}) {}
  Allocator(Device device, Raw raw);
  ~Allocator();
  Allocator(const Allocator&) = delete;
  Allocator& operator=(const Allocator&) = delete;

  void* allocate(size_t bytes);
  void deallocate(void* p, size_t bytes);
  // Returns every cached (unused) block to the system.
  void release_cached();

  AllocatorStats stats() const;
  void reset_peak();
  Device device() const { return device_; }

  // The process-wide host allocator.
  static Allocator& host();

 private:
  static size_t round_size(size_t bytes);
  Device device_;
  Raw raw_;
  mutable std::mutex mu_;
  std::multimap<size_t, void*> free_;  // rounded size -> cached block
  AllocatorStats stats_;
};

}  // namespace spotrain
