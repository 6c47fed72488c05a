// Caching allocator implementation (see allocator.h).
#include "core/allocator.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <iterator>

#include "core/error.h"

namespace spotrain {

namespace {
thread_local const char* t_scope = AllocScope::kUnscoped;

// Scope names live to process exit, each once: a scope's name is compared by address.
const char* intern(const std::string& name) {
  static std::mutex mu;
  static std::set<std::string>* names = new std::set<std::string>;
  std::lock_guard<std::mutex> lock(mu);
  return names->insert(name).first->c_str();
}

// Large host blocks come straight from mmap and go back with munmap, so memory the cache
// gives up really leaves the process (glibc's heap would keep it resident).
void* host_alloc(size_t bytes) {
  if (bytes < Allocator::kLargeBlock) return std::aligned_alloc(64, (bytes + 63) & ~size_t(63));
  void* m = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  return m == MAP_FAILED ? nullptr : m;
}
void host_free(void* p, size_t bytes) {
  if (bytes < Allocator::kLargeBlock) std::free(p);
  else munmap(p, bytes);
}
}  // namespace

AllocScope::Name AllocScope::name(const std::string& what) { return Name{intern(what)}; }
AllocScope::AllocScope(Name n) : prev_(t_scope) { t_scope = n.text; }
AllocScope::~AllocScope() { t_scope = prev_; }
const char* AllocScope::current() { return t_scope; }

Allocator::Allocator(Device device) : Allocator(device, Raw{host_alloc, host_free, true}) {}

Allocator::Allocator(Device device, Raw raw) : device_(device), raw_(raw) {}

Allocator::~Allocator() { release_cached(); }

size_t Allocator::round_size(size_t bytes) {
  if (bytes == 0) bytes = 1;
  // Small blocks to 512 bytes, large ones to 64 KiB (page-aligned pieces).
  if (bytes < kLargeBlock) return (bytes + 511) & ~size_t(511);
  return (bytes + 65535) & ~size_t(65535);
}

void* Allocator::take_large(size_t sz) {
  auto it = large_by_size_.lower_bound({sz, nullptr});
  if (it == large_by_size_.end()) return nullptr;
  if (!raw_.splittable && it->first != sz) return nullptr;
  auto [bsize, addr] = *it;
  large_by_size_.erase(it);
  large_free_.erase(addr);
  stats_.cached_bytes -= bsize;
  if (bsize > sz) {  // keep the tail cached
    char* rest = addr + sz;
    large_free_.emplace(rest, bsize - sz);
    large_by_size_.emplace(bsize - sz, rest);
    stats_.cached_bytes += bsize - sz;
  }
  return addr;
}

void Allocator::give_large(char* p, size_t sz) {
  if (raw_.splittable) {
    auto next = large_free_.find(p + sz);
    if (next != large_free_.end()) {
      large_by_size_.erase({next->second, next->first});
      sz += next->second;
      large_free_.erase(next);
    }
    auto prev = large_free_.lower_bound(p);
    if (prev != large_free_.begin()) {
      --prev;
      if (prev->first + prev->second == p) {
        large_by_size_.erase({prev->second, prev->first});
        p = prev->first;
        sz += prev->second;
        large_free_.erase(prev);
      }
    }
  }
  large_free_.emplace(p, sz);
  large_by_size_.emplace(sz, p);
}

void* Allocator::allocate(size_t bytes) {
  size_t sz = round_size(bytes);
  std::lock_guard<std::mutex> lock(mu_);
  void* p = nullptr;
  if (sz >= kLargeBlock) {
    p = take_large(sz);
  } else if (auto it = small_free_.find(sz); it != small_free_.end()) {
    p = it->second;
    small_free_.erase(it);
    stats_.cached_bytes -= sz;
  }
  if (!p) {
    p = raw_.alloc(sz);
    if (!p) {
      // Give the cache back to the system and try once more before failing.
      trim_locked(0);
      p = raw_.alloc(sz);
      if (!p)
        SPOTRAIN_THROW("out of ", device_name(device_), " memory allocating ", sz, " bytes (",
                       stats_.current_bytes,
                       " in use); reduce --batch-size or use --grad-checkpoint");
    }
    stats_.reserved_bytes += sz;
    stats_.system_allocs++;
  }
  stats_.current_bytes += sz;
  const char* scope = t_scope;
  scope_of_[p] = scope;
  live_by_scope_[scope] += sz;
  if (stats_.current_bytes > stats_.peak_bytes) {
    stats_.peak_bytes = stats_.current_bytes;
    peak_by_scope_ = live_by_scope_;
  }
  return p;
}

void Allocator::deallocate(void* p, size_t bytes) {
  if (!p) return;
  size_t sz = round_size(bytes);
  std::lock_guard<std::mutex> lock(mu_);
  stats_.current_bytes -= sz;
  stats_.cached_bytes += sz;
  if (auto it = scope_of_.find(p); it != scope_of_.end()) {
    live_by_scope_[it->second] -= sz;
    scope_of_.erase(it);
  }
  if (sz >= kLargeBlock) give_large(static_cast<char*>(p), sz);
  else small_free_.emplace(sz, p);
  if (stats_.cached_bytes > cache_limit_) trim_locked(cache_limit_);
}

void Allocator::trim_locked(size_t limit) {
  while (stats_.cached_bytes > limit && !small_free_.empty()) {
    auto it = std::prev(small_free_.end());
    raw_.free(it->second, it->first);
    stats_.reserved_bytes -= it->first;
    stats_.cached_bytes -= it->first;
    small_free_.erase(it);
  }
  while (stats_.cached_bytes > limit && !large_by_size_.empty()) {
    auto it = std::prev(large_by_size_.end());  // largest first
    auto [sz, addr] = *it;
    raw_.free(addr, sz);
    stats_.reserved_bytes -= sz;
    stats_.cached_bytes -= sz;
    large_free_.erase(addr);
    large_by_size_.erase(it);
  }
}

void Allocator::set_cache_limit(size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  cache_limit_ = bytes;
  trim_locked(bytes);
}

void Allocator::release_cached() {
  std::lock_guard<std::mutex> lock(mu_);
  trim_locked(0);
}

AllocatorStats Allocator::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void Allocator::reset_peak() {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.peak_bytes = stats_.current_bytes;
  peak_by_scope_ = live_by_scope_;
}

std::vector<std::pair<std::string, size_t>> Allocator::peak_by_scope() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::pair<std::string, size_t>> out;
  for (const auto& [scope, bytes] : peak_by_scope_)
    if (bytes) out.emplace_back(scope, bytes);
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  return out;
}

void Allocator::restore_peak(size_t peak) {
  std::lock_guard<std::mutex> lock(mu_);
  if (peak > stats_.peak_bytes) stats_.peak_bytes = peak;
}

Allocator& Allocator::host() {
  static Allocator* a = new Allocator(Device::cpu);  // lives to process exit
  return *a;
}

}  // namespace spotrain
