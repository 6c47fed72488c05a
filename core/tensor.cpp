// Tensor and Storage (see tensor.h).
#include "core/tensor.h"

#include <atomic>
#include <sstream>

#include "core/error.h"

namespace spotrain {

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (auto d : s) n *= d;
  return n;
}

std::string shape_str(const Shape& s) {
  std::ostringstream os;
  os << "(";
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << ")";
  return os.str();
}

namespace {
// Versions are unique over the process: a new storage at a freed one's address never
// matches a copy derived from the old one.
uint64_t next_version() {
  static std::atomic<uint64_t> counter{0};
  return ++counter;
}
}  // namespace

Storage::Storage(Allocator& a, size_t n) : bytes(n), device(a.device()), alloc(&a) {
  data = a.allocate(n);
  version = next_version();
}
Storage::Storage(void* external, size_t n, Device d) : data(external), bytes(n), device(d) {
  version = next_version();
}

void Tensor::mark_written() const {
  if (storage_) storage_->version = next_version();
}
Storage::~Storage() {
  if (alloc) alloc->deallocate(data, bytes);
}

Tensor::Tensor(Shape shape, DType dtype, Allocator& alloc, Layout layout, int64_t storage_elems)
    : shape_(std::move(shape)), dtype_(dtype), layout_(layout) {
  for (auto d : shape_) SPOTRAIN_CHECK(d >= 0, "negative tensor dimension in ", shape_str(shape_));
  storage_elems_ = storage_elems < 0 ? shape_numel(shape_) : storage_elems;
  SPOTRAIN_CHECK(storage_elems_ >= shape_numel(shape_), "tensor storage smaller than its shape");
  storage_ = std::make_shared<Storage>(alloc, size_t(storage_elems_) * dtype_size(dtype));
}

Tensor Tensor::host(Shape shape, DType dtype, Layout layout) {
  return Tensor(std::move(shape), dtype, Allocator::host(), layout);
}

Tensor Tensor::view(const Tensor& base, int64_t offset, Shape shape, Layout layout) {
  Tensor t;
  t.storage_ = base.storage_;
  t.offset_ = base.offset_ + offset;
  t.shape_ = std::move(shape);
  t.storage_elems_ = shape_numel(t.shape_);
  t.dtype_ = base.dtype_;
  t.layout_ = layout;
  SPOTRAIN_CHECK(size_t(t.offset_ + t.storage_elems_) * dtype_size(t.dtype_) <= base.storage_->bytes,
                 "tensor view out of range");
  return t;
}

void* Tensor::raw() const {
  if (!storage_) return nullptr;
  return static_cast<char*>(storage_->data) + offset_ * int64_t(dtype_size(dtype_));
}

Tensor Tensor::reshaped(Shape shape, Layout layout) const {
  SPOTRAIN_CHECK(shape_numel(shape) == numel(), "cannot reshape ", shape_str(shape_), " to ",
                 shape_str(shape));
  Tensor t = *this;
  t.shape_ = std::move(shape);
  t.layout_ = layout;
  return t;
}

std::string Tensor::describe() const {
  return str(shape_str(shape_), " ", dtype_name(dtype_), " ", layout_name(layout_), " on ",
             device_name(device()));
}

}  // namespace spotrain
