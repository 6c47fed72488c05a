// Tensor: a logical shape, a dtype, a device, a layout tag and shared storage.
// 4-D tensors always have the logical shape (N, C, H, W); the layout tag says how the
// elements lie in memory (see dtype.h). Copies share storage; clone() copies data.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/dtype.h"

namespace spotrain {

using Shape = std::vector<int64_t>;

int64_t shape_numel(const Shape& s);
std::string shape_str(const Shape& s);

// One allocation from an Allocator, freed back to it when the last Tensor lets go.
struct Storage {
  Storage(Allocator& alloc, size_t bytes);
  Storage(void* external, size_t bytes, Device device);  // not owned
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  void* data = nullptr;
  size_t bytes = 0;
  Device device = Device::cpu;
  Allocator* alloc = nullptr;  // null for external memory
  // Which contents the memory holds: a number no other storage or write has had, renewed
  // by every Tensor::mark_written (see there).
  uint64_t version = 0;
};

class Tensor {
 public:
  Tensor() = default;
  // Allocates a tensor of `shape` whose storage holds `storage_elems` elements (at least
  // numel; the blocked layout pads channels).
  Tensor(Shape shape, DType dtype, Allocator& alloc, Layout layout = Layout::plain,
         int64_t storage_elems = -1);
  // Host fp32 tensor helper.
  static Tensor host(Shape shape, DType dtype = DType::f32, Layout layout = Layout::plain);
  // A view of `count` elements starting at element `offset` of `base`'s storage.
  static Tensor view(const Tensor& base, int64_t offset, Shape shape, Layout layout = Layout::plain);

  bool defined() const { return static_cast<bool>(storage_); }
  const Shape& shape() const { return shape_; }
  int64_t dim(int i) const { return shape_.at(i < 0 ? shape_.size() + i : i); }
  int ndim() const { return static_cast<int>(shape_.size()); }
  int64_t numel() const { return shape_numel(shape_); }
  // Elements the memory holds (numel, or more when the layout pads).
  int64_t storage_elems() const { return storage_elems_; }
  size_t nbytes() const { return size_t(storage_elems_) * dtype_size(dtype_); }
  DType dtype() const { return dtype_; }
  Device device() const { return storage_ ? storage_->device : Device::cpu; }
  Layout layout() const { return layout_; }
  void* raw() const;
  template <typename T>
  T* data() const { return static_cast<T*>(raw()); }
  // Writes that others may have derived copies of. A backend keeps derived copies of
  // weights (reordered, fp16), keyed by the storage's version; whoever changes a tensor's
  // contents in place outside the backend's own ops (a load, a broadcast, a test) writes
  // through write_raw() or calls mark_written(), and the next use refreshes the copies.
  // Backend ops that write into an existing tensor (sgd_step, copy, fill) mark it themselves.
  uint64_t version() const { return storage_ ? storage_->version : 0; }
  void mark_written() const;
  void* write_raw() const {
    mark_written();
    return raw();
  }
  const std::shared_ptr<Storage>& storage() const { return storage_; }

  // Same storage, new logical shape/layout (element count must match).
  Tensor reshaped(Shape shape, Layout layout = Layout::plain) const;
  std::string describe() const;

 private:
  std::shared_ptr<Storage> storage_;
  int64_t offset_ = 0;  // in elements
  Shape shape_;
  int64_t storage_elems_ = 0;
  DType dtype_ = DType::f32;
  Layout layout_ = Layout::plain;
};

}  // namespace spotrain
