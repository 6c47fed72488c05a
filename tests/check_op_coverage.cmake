# The op-coverage test: every op of the Backend interface (each `virtual ... NAME_impl(` of
# kernels/ops.h) must be called on the backend under test (`be->NAME(`) by the op suite's
# shared cases (health/op_cases.cpp, which tests/test_backend_ops.cpp runs on the CPU in its
# blocked and NHWC layouts at fp32 and the 16-bit types and on a GPU, and `spotrain doctor`
# runs on a machine, each against the float64 reference); every other virtual that moves
# data or reads a step back must be called there or in the test file (to_host is what
# values() reads every result with); and every op must have its timed public wrapper in
# kernels/ops.cpp. An op added without a case or without its wrapper fails here. Run:
# cmake -DROOT=<source> -P this.
cmake_minimum_required(VERSION 3.22)
if(NOT ROOT)
  message(FATAL_ERROR "pass -DROOT=<source directory>")
endif()
file(READ ${ROOT}/kernels/ops.h ops_h)
file(READ ${ROOT}/kernels/ops.cpp ops_cpp)
file(READ ${ROOT}/health/op_cases.cpp cases)
file(READ ${ROOT}/tests/test_backend_ops.cpp tests)

# What a backend answers about itself rather than computes, or keeps for a later run (its
# kernel cache): nothing to compare.
set(not_computed device name allocator threads precision_note gpu_pci_bus_id device_line
    host_staging_allocator synchronize queues_ops stream capture device_clock save_kernel_choices
    kernel_cache fuses_conv_bn normalizes_pixels kernel_timing_cut)

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
  set(called "be->${fn}\\(")
  if(fn STREQUAL "to_host")
    set(called "values\\(\\*be,")
  endif()
  if(cases MATCHES "${called}")
    continue()
  endif()
  if(fn IN_LIST ops)
    list(APPEND missing "${fn}: no shared case calls it on the backend under test (health/op_cases.cpp)")
  elseif(NOT tests MATCHES "${called}")
    list(APPEND missing "${fn}: neither the shared cases (health/op_cases.cpp) nor the op suite (tests/test_backend_ops.cpp) call it on the backend under test")
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
message(STATUS "op coverage: ${n_ops} ops are each in the shared op cases, ${n_others} data/read-back calls in those or the op suite")
