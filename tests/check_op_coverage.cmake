# The op-coverage test: every op of the Backend interface (each `virtual ... NAME_impl(` of
# kernels/ops.h), and every other virtual that moves data or reads a step back, must be called
# on the GPU backend (`g->NAME(`) by the GPU test suite (tests/test_gpu_ops.cpp, which compares
# the CUDA backend with the CPU one; to_host is what its values() reads every GPU result
# with), and every op must have its timed public wrapper in kernels/ops.cpp. An op added without
# a GPU test or without its wrapper fails here. Run: cmake -DROOT=<source> -P this.
cmake_minimum_required(VERSION 3.22)
if(NOT ROOT)
  message(FATAL_ERROR "pass -DROOT=<source directory>")
endif()
file(READ ${ROOT}/kernels/ops.h ops_h)
file(READ ${ROOT}/kernels/ops.cpp ops_cpp)
file(READ ${ROOT}/tests/test_gpu_ops.cpp gpu_tests)

# What a backend answers about itself rather than computes: nothing to compare.
set(not_computed device name allocator threads precision_note gpu_pci_bus_id device_line
    host_staging_allocator synchronize queues_ops stream capture device_clock)

string(REGEX MATCHALL "virtual[^;{]*[ *&>]([a-z0-9_]+)\\(" decls "${ops_h}")
set(ops "")
set(others "")
foreach(d ${decls})
  string(REGEX REPLACE ".*[ *&]([a-z0-9_]+)\\($" "\\1" fn "${d}")
  if(fn MATCHES "^(.+)_impl$")
    list(APPEND ops ${CMAKE_MATCH_1})
  elseif(NOT fn IN_LIST not_computed)
    list(APPEND others ${fn})
  endif()
endforeach()
list(REMOVE_DUPLICATES ops)
list(REMOVE_DUPLICATES others)
list(LENGTH ops n_ops)
if(n_ops LESS 25)
  message(FATAL_ERROR "only ${n_ops} ops found in ${ROOT}/kernels/ops.h: has its form changed?")
endif()

set(missing "")
foreach(fn ${ops} ${others})
  set(called "g->${fn}\\(")
  if(fn STREQUAL "to_host")
    set(called "values\\(\\*g,")
  endif()
  if(NOT gpu_tests MATCHES "${called}")
    list(APPEND missing "${fn}: no GPU test calls it on the GPU backend (tests/test_gpu_ops.cpp)")
  endif()
endforeach()
foreach(fn ${ops})
  if(NOT ops_cpp MATCHES "Backend::${fn}\\(")
    list(APPEND missing "${fn}: no timed wrapper Backend::${fn} in kernels/ops.cpp")
  endif()
endforeach()
if(missing)
  list(JOIN missing "\n  " text)
  message(FATAL_ERROR "Backend ops without a check:\n  ${text}")
endif()
list(LENGTH others n_others)
message(STATUS "op coverage: ${n_ops} ops and ${n_others} data/read-back calls each have a GPU test")
