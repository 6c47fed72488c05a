# The include-direction test: reads the #include "..." lines of every source under the
# library folders and fails when a folder includes one it must not (docs/ARCHITECTURE.md):
#   core <- kernels <- layers <- engine <- observe <- run <- health <- tools
#   core <- io, comm, checkpoints   (used by engine and run); core <- spot (used by run)
#   kernels <- kernels/reference <- health   (the float64 reference: the op suite's only)
# (health: the checks `spotrain doctor` and the tests share, such as the op suite's cases)
# Each folder below is one node of that picture; kernels/cpu, kernels/cuda and
# kernels/reference are nodes of their own, so the table says that they never include each
# other and that no training code (layers, engine, run, ...) reaches the reference. Run:
# cmake -DROOT=<src> -P this.
if(NOT ROOT)
  message(FATAL_ERROR "pass -DROOT=<source directory>")
endif()

# folder -> the folders its files may include (besides its own)
set(allowed_core "")
set(allowed_kernels "core;kernels/cpu;kernels/cuda")  # the factory makes either backend
set(allowed_kernels/cpu "core;kernels")
set(allowed_kernels/cuda "core;kernels")
set(allowed_kernels/reference "core;kernels")
set(allowed_layers "core;kernels")
set(allowed_io "core")
set(allowed_comm "core")
set(allowed_checkpoints "core")
set(allowed_spot "core")
set(allowed_engine "core;kernels;layers;io;comm;checkpoints")
set(allowed_observe "core;kernels;layers;io;comm;checkpoints;engine")
set(allowed_run "core;kernels;layers;io;comm;checkpoints;spot;engine;observe")
set(allowed_health "core;kernels;kernels/reference;layers;io;comm;checkpoints;spot;engine;observe;run")
set(allowed_tools "core;kernels;layers;io;comm;checkpoints;spot;engine;observe;run;health")
set(folders core kernels kernels/cpu kernels/cuda kernels/reference layers io comm checkpoints spot
    engine observe run health tools)

# The folder (node) a path belongs to: its longest prefix among `folders`.
function(folder_of path out)
  set(best "")
  foreach(d ${folders})
    string(LENGTH "${d}" n)
    string(LENGTH "${best}" b)
    if(path MATCHES "^${d}/" AND n GREATER b)
      set(best "${d}")
    endif()
  endforeach()
  set(${out} "${best}" PARENT_SCOPE)
endfunction()

set(violations "")
set(checked 0)
foreach(dir ${folders})
  file(GLOB files RELATIVE ${ROOT} ${ROOT}/${dir}/*.h ${ROOT}/${dir}/*.cpp ${ROOT}/${dir}/*.cu
       ${ROOT}/${dir}/*/*.h ${ROOT}/${dir}/*/*.cpp ${ROOT}/${dir}/*/*.cu)
  foreach(f ${files})
    folder_of(${f} from)
    if(NOT from STREQUAL dir)
      continue()  # a file of a sub-folder node, checked as its own
    endif()
    file(STRINGS ${ROOT}/${f} lines REGEX "^[ \t]*#[ \t]*include[ \t]+\"")
    foreach(line ${lines})
      string(REGEX REPLACE "^[ \t]*#[ \t]*include[ \t]+\"([^\"]+)\".*" "\\1" inc "${line}")
      math(EXPR checked "${checked} + 1")
      folder_of(${inc} to)
      if(to STREQUAL "" OR to STREQUAL from)
        continue()  # its own folder, or not one of ours (a system or library header)
      endif()
      list(FIND allowed_${from} "${to}" ok)
      if(ok LESS 0)
        string(REPLACE ";" ", " may "${allowed_${from}}")
        list(APPEND violations "${f}: includes ${inc} (${from}/ may include only itself and: ${may})")
      endif()
    endforeach()
  endforeach()
endforeach()

if(checked LESS 50)
  message(FATAL_ERROR "only ${checked} #include lines found under ${ROOT}: wrong ROOT?")
endif()
if(violations)
  list(JOIN violations "\n  " text)
  message(FATAL_ERROR "include direction broken:\n  ${text}")
endif()
message(STATUS "include direction: ${checked} #include lines follow the arrows")
