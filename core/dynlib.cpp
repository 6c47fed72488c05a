// DynLib (see dynlib.h).
#include "core/dynlib.h"

#include <dlfcn.h>

#include "core/error.h"

#ifndef SPOTRAIN_NCCL_PATH
#define SPOTRAIN_NCCL_PATH ""
#endif

namespace spotrain {

DynLib& nvml_library() {
  static DynLib lib("NVML (the NVIDIA driver's libnvidia-ml)", {"libnvidia-ml.so.1"});
  return lib;
}

DynLib& nccl_library() {
  static DynLib lib("NCCL 2", {SPOTRAIN_NCCL_PATH, "libnccl.so.2"});
  return lib;
}

DynLib::DynLib(std::string what, std::vector<std::string> names)
    : what_(std::move(what)), names_(std::move(names)) {}

void DynLib::open_once() {
  std::call_once(once_, [this] {
    for (const std::string& n : names_) {
      if (n.empty()) continue;
      handle_ = dlopen(n.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (handle_) return;
      const char* e = dlerror();
      if (error_.empty() && e) error_ = e;  // the first name's reason says the most
    }
    if (error_.empty()) error_ = "no library name to try";
  });
}

bool DynLib::available() {
  open_once();
  return handle_ != nullptr;
}

std::string DynLib::load_error() {
  open_once();
  return handle_ ? std::string() : error_;
}

void* DynLib::require(const char* symbol) {
  SPOTRAIN_CHECK(available(), "cannot load ", what_, ": ", error_,
                 " (install it, or add its folder to LD_LIBRARY_PATH)");
  void* p = dlsym(handle_, symbol);
  SPOTRAIN_CHECK(p, what_, " has no ", symbol, ": the library is too old for this build");
  return p;
}

}  // namespace spotrain
