# cmake/flashinfer.cmake - the CUDA kernel plugin libmetrale_gpu_attention.so: FlashInfer's
# ragged BF16 prefill attention (head_dim 64, 128, 256) behind the C ABI of
# kernels/cuda/attention/flashinfer_ragged_prefill.h.
#
# FlashInfer launches through the CUDA runtime, so its kernels live in a shared library of their
# own, with cudart linked statically and only the mg_fi_* entry points exported; the CUDA backend
# dlopens it on first use (src/backends/cuda/cuda_plugin.c) and the core links no CUDA library. The
# headers come from the pinned flashinfer-python wheel (scripts/fetch_flashinfer.sh) into
# third_party/, at configure time.
#
# Translation units: one host unit (plan/run glue); FA2 kernels, one unit per (head_dim, mask),
# each with and without a sliding window, for every architecture in METRALE_CUDA_ARCHS; and when
# 90a is among them the Hopper FA3 kernels, one unit per (head_dim, mask), for sm_90a only. Paged
# kernels: FA2 units per (KV dtype, head_dim, soft cap) (fi_paged_units) and, with 90a, one FA3
# paged prefill unit (BF16, head_dim 128).
#
# Compile time per unit (nvcc 13.0, METRALE_CUDA_ARCHS=90a, 2-core build machine at -j2 with
# other builds running, load ~2.5; seconds of wall time each, two units at a time):
#                   FA2 causal  FA2 full  FA3 causal  FA3 full
#   head_dim 64         28        25          88         85
#   head_dim 128        26        29          61         58
#   head_dim 256        37        39          66         67
#   host unit 11. All 13 units: ~620 unit-seconds, ~5 min of wall time at -j2 (head_dim 128
# alone: ~185 unit-seconds, ~1.5 min), so 64 and 256 add ~3.5 min to a clean CI build. A first,
# busier run measured 33-73 s (FA2) and 51-102 s (FA3) per unit, in the same proportions.
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

set(fi_src ${PROJECT_SOURCE_DIR}/kernels/cuda/attention)
set(fi_out ${PROJECT_BINARY_DIR}/kernels/attention)
# FlashInfer's bundled CCCL comes before the toolkit's: its templates need that CCCL version.
set(fi_includes
  -I${METRALE_FI_ROOT}/cccl/libcudacxx/include -I${METRALE_FI_ROOT}/cccl/cub
  -I${METRALE_FI_ROOT}/cccl/thrust -I${METRALE_FI_ROOT}/include
  -I${METRALE_FI_ROOT}/cutlass/include -I${METRALE_FI_ROOT}/cutlass/tools/util/include
  -I${PROJECT_SOURCE_DIR}/include -I${fi_src} -I${PROJECT_SOURCE_DIR}/kernels/cuda/common)
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

# The kernel units: flashinfer_ragged_prefill_fa2.cu compiled once per (head_dim, mask) for every
# architecture in METRALE_CUDA_ARCHS, flashinfer_ragged_prefill_sm90.cu once per (head_dim, mask)
# of fi_fa3_head_dims for sm_90a only, each with and without a sliding window where the path has
# one. The host unit learns which FA3 head_dims exist from METRALE_FI_FA3_HD<d>.
set(fi_fa2_head_dims 64 128 256)
set(fi_fa3_head_dims "")
if(have_fa3)
  set(fi_fa3_head_dims 64 128 256)
endif()

set(fi_host_defines -DMETRALE_FI_HAVE_FA3=${have_fa3} -DMETRALE_FI_FA3_PAGED=${have_fa3})
foreach(head_dim ${fi_fa3_head_dims})
  list(APPEND fi_host_defines -DMETRALE_FI_FA3_HD${head_dim}=1)
endforeach()

# Each unit: "<object name>|<source>|<sm90 or all>|<head_dim>|<causal>" (paged units: the last
# field is "<soft-cap mode>,<FP8 pools>" instead; they are always causal).
set(fi_units "flashinfer_ragged_prefill|flashinfer_ragged_prefill|all||")
# Paged FA2 kernels (flashinfer_paged_fa2.cu; decode and prefill over the paged KV cache): one
# unit per (KV dtype, head_dim, soft cap), causal, sliding window chosen at run time, CTA tiles
# 16/64/128. Each unit costs ~25-40 s of CI compile time, so only what models use is built: BF16
# pools at head_dim 128 and 256 (Gemma 2's soft-capped heads are 256) with and without the soft
# cap, at 64 without it; FP8 E4M3 pools at head_dim 128 without it. Changing this list needs
# the same in mg_fi_paged_built (flashinfer_ragged_prefill.h) and fa2_paged_launch_for.
# Compile time per unit (nvcc 13.0, sm_90a, the 2-core build machine at load ~6 with other
# builds running, so CPU seconds, user + sys, say more than wall time): BF16 head_dim 64 without
# soft-cap 14.7 s (67 s wall), BF16 head_dim 256 with soft-cap 18.3 s (51 s wall), FP8 head_dim
# 128 without soft-cap 17.7 s (73 s wall); an earlier, quieter run measured 22 s (no soft-cap)
# and 31 s (soft-cap) of wall time for the BF16 head_dim 128 units. The host unit (with the
# paged glue) 9.5-10 s.
set(fi_paged_units bf16:64:0 bf16:128:0 bf16:128:1 bf16:256:0 bf16:256:1 fp8:128:0)
foreach(paged_unit ${fi_paged_units})
  string(REPLACE ":" ";" paged_fields "${paged_unit}")
  list(GET paged_fields 0 kv_dtype)
  list(GET paged_fields 1 head_dim)
  list(GET paged_fields 2 cap)
  set(kv_fp8 0)
  set(name_dtype "")
  if(kv_dtype STREQUAL "fp8")
    set(kv_fp8 1)
    set(name_dtype "_fp8")
  endif()
  # The last field carries "<soft cap>,<fp8>" for the paged source.
  list(APPEND fi_units "flashinfer_paged_fa2${name_dtype}_hd${head_dim}_cap${cap}|flashinfer_paged_fa2|all|${head_dim}|${cap},${kv_fp8}")
endforeach()
# The Hopper (FA3) paged prefill kernel (flashinfer_paged_sm90.cu), sm_90a only: ONE unit and
# one instantiation, BF16 pools at head_dim 128, causal, sliding window at run time, no soft cap
# (the host unit knows it from METRALE_FI_FA3_PAGED and fa3_paged_built; other paged shapes run
# on FA2). Compile time: 39.0-39.7 s wall (35.7-36.6 s user + 3.1-3.2 s sys; nvcc 13.0, sm_90a,
# the 2-core build machine at load ~1, two runs), about one ragged FA3 unit's worth of CI.
if(have_fa3)
  list(APPEND fi_units "flashinfer_paged_sm90_hd128|flashinfer_paged_sm90|sm90||")
endif()
foreach(path fa2 sm90)
  set(head_dims ${fi_fa2_head_dims})
  set(archs all)
  if(path STREQUAL "sm90")
    set(head_dims ${fi_fa3_head_dims})
    set(archs sm90)
  endif()
  foreach(head_dim ${head_dims})
    foreach(mask causal full)
      set(causal 0)
      if(mask STREQUAL "causal")
        set(causal 1)
      endif()
      list(APPEND fi_units "flashinfer_ragged_prefill_${path}_hd${head_dim}_${mask}|flashinfer_ragged_prefill_${path}|${archs}|${head_dim}|${causal}")
    endforeach()
  endforeach()
endforeach()

set(fi_objects "")
foreach(unit ${fi_units})
  string(REPLACE "|" ";" fields "${unit}")
  list(GET fields 0 name)
  list(GET fields 1 source)
  list(GET fields 2 archs)
  list(GET fields 3 head_dim)
  list(GET fields 4 causal)
  set(gencode ${fa2_gencode})
  if(archs STREQUAL "sm90")
    set(gencode "-gencode=arch=compute_90a,code=sm_90a")
  endif()
  set(defines ${fi_host_defines})
  if(source STREQUAL "flashinfer_paged_fa2")
    string(REPLACE "," ";" cap_fp8 "${causal}")
    list(GET cap_fp8 0 cap)
    list(GET cap_fp8 1 kv_fp8)
    set(defines -DMG_FI_UNIT_HEAD_DIM=${head_dim} -DMG_FI_UNIT_SOFT_CAP=${cap}
                -DMG_FI_UNIT_KV_FP8=${kv_fp8})
  elseif(NOT head_dim STREQUAL "")
    set(defines -DMG_FI_UNIT_HEAD_DIM=${head_dim} -DMG_FI_UNIT_CAUSAL=${causal})
  endif()
  set(obj ${fi_out}/${name}.o)
  add_custom_command(
    OUTPUT ${obj}
    COMMAND ${CMAKE_COMMAND} -E make_directory ${fi_out}
    COMMAND ${METRALE_NVCC_LAUNCHER} ${CMAKE_CUDA_COMPILER} -c ${fi_flags} ${gencode} ${defines} ${fi_includes} -MD -MF
            ${obj}.d -o ${obj} ${fi_src}/${source}.cu
    DEPENDS ${fi_src}/${source}.cu
    DEPFILE ${obj}.d
    COMMENT "nvcc ${name} (FlashInfer instantiations)"
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
message(STATUS "metrale: FlashInfer ${METRALE_FI_VERSION} attention plugin, FA2 head_dims "
               "${fi_fa2_head_dims} for ${METRALE_CUDA_ARCHS}, FA3 head_dims "
               "'${fi_fa3_head_dims}' for sm_90a")
