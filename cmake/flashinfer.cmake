# cmake/flashinfer.cmake - the CUDA kernel plugin libmetrale_gpu_attention.so: FlashInfer's
# ragged BF16 prefill attention (head_dim 128) behind the C ABI of
# kernels/cuda/flashinfer_ragged_prefill.h.
#
# FlashInfer launches through the CUDA runtime, so its kernels live in a shared library of their
# own, with cudart linked statically and only the mg_fi_* entry points exported; the CUDA backend
# dlopens it on first use (src/cuda/cuda_plugin.c) and the core links no CUDA library. The
# headers come from the pinned flashinfer-python wheel (scripts/fetch_flashinfer.sh) into
# third_party/, at configure time.
#
# Translation units: one host TU (plan/run glue), FA2 kernels in two TUs (causal, no mask; each
# with and without a sliding window) for every architecture in METRALE_CUDA_ARCHS, and when
# 90a is among them the Hopper FA3 kernels in two TUs for sm_90a only.
if(NOT METRALE_CUDA_KERNELS)
  message(STATUS "metrale: METRALE_CUDA_KERNELS is off, so no FlashInfer attention plugin")
  return()
endif()

set(fetch_script ${PROJECT_SOURCE_DIR}/scripts/fetch_flashinfer.sh)
file(STRINGS ${fetch_script} fi_version_line REGEX "^version=")
string(REPLACE "version=" "" METRALE_FI_VERSION "${fi_version_line}")
set(METRALE_FI_ROOT ${PROJECT_SOURCE_DIR}/third_party/flashinfer-python-${METRALE_FI_VERSION})
execute_process(COMMAND bash ${fetch_script} RESULT_VARIABLE fetch_rc)
if(NOT fetch_rc EQUAL 0)
  message(FATAL_ERROR "metrale: fetching the FlashInfer headers failed (see above). Configure "
                      "with -DMETRALE_FLASHINFER=OFF to build without the attention plugin.")
endif()
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${fetch_script})

set(fi_src ${PROJECT_SOURCE_DIR}/kernels/cuda)
set(fi_out ${PROJECT_BINARY_DIR}/kernels/attention)
# FlashInfer's bundled CCCL comes before the toolkit's: its templates need that CCCL version.
set(fi_includes
  -I${METRALE_FI_ROOT}/cccl/libcudacxx/include -I${METRALE_FI_ROOT}/cccl/cub
  -I${METRALE_FI_ROOT}/cccl/thrust -I${METRALE_FI_ROOT}/include
  -I${METRALE_FI_ROOT}/cutlass/include -I${METRALE_FI_ROOT}/cutlass/tools/util/include
  -I${PROJECT_SOURCE_DIR}/include -I${fi_src})
# Warnings inside CUTLASS/CuTe headers we cannot change: defaulted __host__ __device__
# constructors, C++20 structured-binding captures, deprecated copy_if.
set(fi_flags -O3 -std=c++17 -DNDEBUG --expt-relaxed-constexpr
  -Xcompiler=-fPIC,-fvisibility=hidden -diag-suppress=20012,3357,1444)

set(fa2_gencode "")
foreach(arch ${METRALE_CUDA_ARCHS})
  list(APPEND fa2_gencode "-gencode=arch=compute_${arch},code=sm_${arch}")
endforeach()
set(have_fa3 0)
if("90a" IN_LIST METRALE_CUDA_ARCHS)
  set(have_fa3 1)
endif()

# name -> extra nvcc arguments
set(fi_units flashinfer_ragged_prefill flashinfer_ragged_prefill_fa2_causal
             flashinfer_ragged_prefill_fa2_full)
if(have_fa3)
  list(APPEND fi_units flashinfer_ragged_prefill_sm90_causal flashinfer_ragged_prefill_sm90_full)
endif()

set(fi_objects "")
foreach(unit ${fi_units})
  set(gencode ${fa2_gencode})
  if(unit MATCHES "_sm90_")
    set(gencode "-gencode=arch=compute_90a,code=sm_90a")
  endif()
  set(obj ${fi_out}/${unit}.o)
  add_custom_command(
    OUTPUT ${obj}
    COMMAND ${CMAKE_COMMAND} -E make_directory ${fi_out}
    COMMAND ${CMAKE_CUDA_COMPILER} -c ${fi_flags} ${gencode} -DMETRALE_FI_HAVE_FA3=${have_fa3}
            ${fi_includes} -MD -MF ${obj}.d -o ${obj} ${fi_src}/${unit}.cu
    DEPENDS ${fi_src}/${unit}.cu
    DEPFILE ${obj}.d
    COMMENT "nvcc ${unit}.cu (FlashInfer instantiations)"
    VERBATIM)
  list(APPEND fi_objects ${obj})
endforeach()

set(METRALE_ATTENTION_PLUGIN ${PROJECT_BINARY_DIR}/libmetrale_gpu_attention.so)
add_custom_command(
  OUTPUT ${METRALE_ATTENTION_PLUGIN}
  COMMAND ${CMAKE_CUDA_COMPILER} -shared -cudart static -o ${METRALE_ATTENTION_PLUGIN}
          ${fi_objects} -Xlinker --exclude-libs,ALL -Xlinker --no-undefined
  DEPENDS ${fi_objects}
  COMMENT "nvcc -shared libmetrale_gpu_attention.so (cudart static)"
  VERBATIM)
add_custom_target(metrale_gpu_attention ALL DEPENDS ${METRALE_ATTENTION_PLUGIN})
message(STATUS "metrale: FlashInfer ${METRALE_FI_VERSION} attention plugin, FA2 for "
               "${METRALE_CUDA_ARCHS}, FA3 ${have_fa3}")
