# cmake/cutlass.cmake - the CUDA kernel plugin libmetrale_gpu_cutlass.so: the GEMM providers
# built on CUTLASS (kernels/cuda/cutlass/cutlass_*.cu), behind the C ABI of
# kernels/cuda/cutlass/cutlass_plugin.h.
#
# Like the attention plugin (cmake/flashinfer.cmake) it launches through the CUDA runtime, so it
# is a shared library of its own with cudart linked statically, only its mg_cutlass_* entry
# points exported, dlopened by the providers on first use. CUTLASS comes from the same pinned
# flashinfer-python wheel as the attention kernels (scripts/fetch_flashinfer.sh): one CUTLASS
# version for the whole project (4.5.0 in flashinfer-python 0.7.4).
#
# Every unit is one translation unit holding few kernel instantiations, compiled for exactly the
# architecture its kernels need. Blackwell units (sm_100a, sm_120a) are compiled only when
# METRALE_CUTLASS_BLACKWELL is on (`make build` and `make test` turn it on, so CI always compiles
# them); the host code picks them at run time on a device of that compute capability only.
# Compile time per unit is listed next to each entry below (nvcc 13.0 on the 2-core build
# machine, other builds running).
if(NOT METRALE_CUDA_KERNELS)
  message(STATUS "metrale: METRALE_CUDA_KERNELS is off, so no CUTLASS plugin")
  return()
endif()

set(fetch_script ${PROJECT_SOURCE_DIR}/scripts/fetch_flashinfer.sh)
file(STRINGS ${fetch_script} cutlass_fi_version_line REGEX "^version=")
string(REPLACE "version=" "" cutlass_fi_version "${cutlass_fi_version_line}")
set(METRALE_CUTLASS_ROOT ${PROJECT_SOURCE_DIR}/third_party/flashinfer-python-${cutlass_fi_version}/cutlass)
execute_process(COMMAND bash ${fetch_script} RESULT_VARIABLE fetch_rc)
if(NOT fetch_rc EQUAL 0)
  message(FATAL_ERROR "metrale: fetching the CUTLASS headers failed (see above). Configure "
                      "with -DMETRALE_CUTLASS=OFF to build without the CUTLASS plugin.")
endif()
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${fetch_script})
file(STRINGS ${METRALE_CUTLASS_ROOT}/include/cutlass/version.h cutlass_version_lines
     REGEX "#define CUTLASS_(MAJOR|MINOR|PATCH) ")
string(REGEX REPLACE ".*CUTLASS_MAJOR ([0-9]+).*CUTLASS_MINOR ([0-9]+).*CUTLASS_PATCH ([0-9]+).*"
       "\\1.\\2.\\3" METRALE_CUTLASS_VERSION "${cutlass_version_lines}")

set(cutlass_src ${PROJECT_SOURCE_DIR}/kernels/cuda/cutlass)
set(cutlass_out ${PROJECT_BINARY_DIR}/kernels/cutlass)
set(cutlass_includes
  -I${METRALE_CUTLASS_ROOT}/include -I${METRALE_CUTLASS_ROOT}/tools/util/include
  -I${PROJECT_SOURCE_DIR}/include -I${cutlass_src} -I${PROJECT_SOURCE_DIR}/kernels/cuda/common)
# Warnings inside CUTLASS/CuTe headers we cannot change (as in cmake/flashinfer.cmake).
set(cutlass_flags -O3 -std=c++17 -DNDEBUG --expt-relaxed-constexpr
  -Xcompiler=-fPIC,-fvisibility=hidden -diag-suppress=20012,3357,1444)

# Each unit: "<source name without .cu>|<architecture: host, 90a, 100a or 120a>". The host unit
# (the ABI version and which architectures were built) has no kernels.
set(cutlass_units "cutlass_plugin|host")
# -- Hopper grouped MoE GEMMs (kernels/cuda/cutlass/cutlass_moe_sm90*.cu)
list(APPEND cutlass_units "cutlass_moe_sm90_bf16|90a")         # BF16, one kernel: 1 min 18 s
list(APPEND cutlass_units "cutlass_moe_sm90_fp8|90a")          # FP8 128x128 blocks, one kernel: 2 min 6 s
list(APPEND cutlass_units "cutlass_moe_sm90_fp8_rowwise|90a")  # FP8 row-wise, one kernel: 2 min 7 s
# -- Hopper dense BF16 GEMMs (kernels/cuda/cutlass/cutlass_dense_sm90*.cu)
# cutlass_dense_sm90: 3 kernels (cooperative 128x128 and 128x256, ping-pong 64x128); 95 s wall
# (54 s user)
list(APPEND cutlass_units "cutlass_dense_sm90|90a")
# -- Blackwell NVFP4 dense and grouped GEMMs (kernels/cuda/cutlass/cutlass_nvfp4_sm1*.cu)
#    the scale-factor layout and workspace code, host only (needs no GPU; tested on the CPU): 17 s
list(APPEND cutlass_units "cutlass_nvfp4_layout|host")
#    sm_100a: dense + grouped, 128x128x256 tiles, 1 SM, activation quantizer: 2 min 0-30 s
list(APPEND cutlass_units "cutlass_nvfp4_sm100|100a")
#    sm_120a: dense + grouped, 128x128x128 tiles, cooperative, activation quantizer: 1 min 10 s-2 min
list(APPEND cutlass_units "cutlass_nvfp4_sm120|120a")

set(cutlass_host_defines "")
set(cutlass_objects "")
foreach(unit ${cutlass_units})
  string(REPLACE "|" ";" fields "${unit}")
  list(GET fields 0 name)
  list(GET fields 1 arch)
  if(arch STREQUAL "host")
    set(gencode "-gencode=arch=compute_90a,code=sm_90a")
  else()
    if((arch STREQUAL "100a" OR arch STREQUAL "120a") AND NOT METRALE_CUTLASS_BLACKWELL)
      continue()
    endif()
    set(gencode "-gencode=arch=compute_${arch},code=sm_${arch}")
    list(APPEND cutlass_host_defines -DMETRALE_CUTLASS_HAVE_${name}=1)
  endif()
  set(obj ${cutlass_out}/${name}.o)
  list(APPEND cutlass_objects ${obj})
  set(unit_gencode_${name} ${gencode})
endforeach()
list(REMOVE_DUPLICATES cutlass_host_defines)

foreach(unit ${cutlass_units})
  string(REPLACE "|" ";" fields "${unit}")
  list(GET fields 0 name)
  list(GET fields 1 arch)
  if(NOT DEFINED unit_gencode_${name})
    continue()
  endif()
  set(defines "")
  if(arch STREQUAL "host")
    set(defines ${cutlass_host_defines})
  endif()
  set(obj ${cutlass_out}/${name}.o)
  add_custom_command(
    OUTPUT ${obj}
    COMMAND ${CMAKE_COMMAND} -E make_directory ${cutlass_out}
    COMMAND ${METRALE_NVCC_LAUNCHER} ${CMAKE_CUDA_COMPILER} -c ${cutlass_flags} ${unit_gencode_${name}}
            ${defines} ${cutlass_includes} -MD -MF ${obj}.d -o ${obj} ${cutlass_src}/${name}.cu
    DEPENDS ${cutlass_src}/${name}.cu
    DEPFILE ${obj}.d
    COMMENT "nvcc ${name} (CUTLASS ${arch})"
    VERBATIM)
endforeach()

set(METRALE_CUTLASS_PLUGIN ${PROJECT_BINARY_DIR}/libmetrale_gpu_cutlass.so)
add_custom_command(
  OUTPUT ${METRALE_CUTLASS_PLUGIN}
  COMMAND ${CMAKE_CUDA_COMPILER} -shared -cudart static -o ${METRALE_CUTLASS_PLUGIN}
          ${cutlass_objects} -Xlinker --exclude-libs,ALL -Xlinker --no-undefined
  DEPENDS ${cutlass_objects}
  COMMENT "nvcc -shared libmetrale_gpu_cutlass.so (cudart static)"
  VERBATIM)
add_custom_target(metrale_gpu_cutlass ALL DEPENDS ${METRALE_CUTLASS_PLUGIN})
message(STATUS "metrale: CUTLASS ${METRALE_CUTLASS_VERSION} plugin, units: ${cutlass_objects}")
