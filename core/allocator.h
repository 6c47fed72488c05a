// Caching allocator: one per device. Freed blocks stay cached and are reused, so after the
// first steps a training step asks the system for nothing. Small blocks are reused by exact
// size; large blocks (>= 1 MiB) come from page-aligned regions that are split best-fit and
// coalesced with free neighbours on release, so the memory held stays close to the true
// peak of live tensors. It reports current and peak bytes in use (`bench` prints them), and
// what the live bytes at the peak were allocated for (AllocScope names it).
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/dtype.h"

namespace spotrain {

struct AllocatorStats {
  size_t current_bytes = 0;   // bytes handed out and not yet returned
  size_t peak_bytes = 0;      // maximum of current_bytes since the last reset_peak()
  size_t reserved_bytes = 0;  // bytes held from the system (in use + cached)
  size_t cached_bytes = 0;    // bytes held but not in use
  size_t system_allocs = 0;   // calls that reached the system allocator
};

// Names what the allocations made in its lifetime on this thread are for ("Conv2d forward",
// "weight copies"): the innermost scope names them. Allocator::peak_by_scope() gives the live
// bytes under each name at the peak. Costs a hash-map entry per live block. A scope opened
// often takes a Name made once (name() keeps one copy of each text for the process).
class AllocScope {
 public:
  struct Name {
    const char* text;
  };
  static Name name(const std::string& what);
  explicit AllocScope(Name n);
  explicit AllocScope(const std::string& what) : AllocScope(name(what)) {}
  ~AllocScope();
  AllocScope(const AllocScope&) = delete;
  AllocScope& operator=(const AllocScope&) = delete;
  // The name allocations made now get (kUnscoped outside every scope).
  static const char* current();
  static constexpr const char* kUnscoped = "outside any layer (weights, gradients, optimizer state, data)";

 private:
  const char* prev_;
};

class Allocator {
 public:
  // Raw system memory for this device. `splittable` says any page-aligned sub-range of an
  // allocation may be freed on its own and neighbouring allocations may be merged (true
  // for host mmap; a device allocator that must free what it allocated sets it false).
  struct Raw {
    void* (*alloc)(size_t bytes);
    void (*free)(void* p, size_t bytes);
    bool splittable;
  };
  explicit Allocator(Device device);  // host memory
  Allocator(Device device, Raw raw);
  ~Allocator();
  Allocator(const Allocator&) = delete;
  Allocator& operator=(const Allocator&) = delete;

  void* allocate(size_t bytes);
  void deallocate(void* p, size_t bytes);
  // Returns every cached (unused) block to the system.
  void release_cached();
  // At most this many free bytes stay cached (default: no limit).
  void set_cache_limit(size_t bytes);

  AllocatorStats stats() const;
  void reset_peak();
  // Puts back a peak measured earlier (after a reset_peak() used for a sub-measurement).
  void restore_peak(size_t peak);
  // The bytes live at the peak since the last reset_peak(), by the AllocScope they were
  // allocated under, largest first.
  std::vector<std::pair<std::string, size_t>> peak_by_scope() const;
  Device device() const { return device_; }

  // The process-wide host allocator.
  static Allocator& host();

  static constexpr size_t kLargeBlock = size_t(1) << 20;

 private:
  static size_t round_size(size_t bytes);
  void* take_large(size_t sz);
  void give_large(char* p, size_t sz);
  void trim_locked(size_t limit);

  Device device_;
  Raw raw_;
  mutable std::mutex mu_;
  std::multimap<size_t, void*> small_free_;         // size -> block (exact-size reuse)
  std::map<char*, size_t> large_free_;              // address -> size (for coalescing)
  std::set<std::pair<size_t, char*>> large_by_size_;  // (size, address) for best fit
  AllocatorStats stats_;
  size_t cache_limit_ = SIZE_MAX;
  // Live blocks' scopes, bytes live per scope, and those bytes at the peak.
  std::unordered_map<void*, const char*> scope_of_;
  std::unordered_map<const char*, size_t> live_by_scope_, peak_by_scope_;
};

}  // namespace spotrain
