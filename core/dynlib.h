// Shared libraries opened on first use (dlopen) and their functions resolved by name on first
// call. One binary can then carry optional GPU libraries (cuDNN, NCCL) that it never loads on
// a machine without a GPU, and a library that is missing where it is needed is one clear error.
#pragma once
#include <atomic>
#include <mutex>
#include <string>
#include <vector>

namespace spotrain {

class DynLib {
 public:
  // `what` names the library in messages ("cuDNN 9"); `names` are tried in order: a path
  // found when the program was built, then sonames the dynamic loader searches for.
  DynLib(std::string what, std::vector<std::string> names);
  DynLib(const DynLib&) = delete;
  DynLib& operator=(const DynLib&) = delete;

  // Opens the library on the first call; false when no name loads.
  bool available();
  // Why it did not open, after available() returned false.
  std::string load_error();
  // The address of `symbol`; throws Error naming the library when it or the symbol is missing.
  void* require(const char* symbol);

 private:
  void open_once();
  std::string what_;
  std::vector<std::string> names_;
  std::once_flag once_;
  void* handle_ = nullptr;
  std::string error_;
};

// One function of a DynLib, called like the function itself. SPOTRAIN_DYN_FN(lib, cudnnCreate)
// declares an object named cudnnCreate, with ::cudnnCreate's signature, whose first call
// resolves the symbol from lib(); unqualified calls inside the declaring namespace reach it
// instead of the library's own declaration.
template <class F>
class DynFn;
template <class R, class... A>
class DynFn<R(A...)> {
 public:
  constexpr DynFn(DynLib& (*lib)(), const char* name) : lib_(lib), name_(name) {}
  R operator()(A... a) const {
    R (*f)(A...) = fn_.load(std::memory_order_acquire);
    if (!f) {
      f = reinterpret_cast<R (*)(A...)>(lib_().require(name_));
      fn_.store(f, std::memory_order_release);
    }
    return f(a...);
  }

 private:
  DynLib& (*lib_)();
  const char* name_;
  mutable std::atomic<R (*)(A...)> fn_{nullptr};
};

// The NVIDIA libraries that more than one folder uses, each opened by one DynLib: NVML (the
// driver's libnvidia-ml: telemetry, and the driver's version for reports) and NCCL 2 (comm/'s
// device communicator, and its version for reports; the path CMake found, then the soname).
DynLib& nvml_library();
DynLib& nccl_library();

}  // namespace spotrain

#define SPOTRAIN_DYN_FN(lib, fn) inline const ::spotrain::DynFn<decltype(::fn)> fn{&lib, #fn}
