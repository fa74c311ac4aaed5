# The MLX checkpoint tests that need more than a test executable (included by CMakeLists.txt
# after the tests are defined).

# MLX itself as the reference of the MLX ops: the fixture installs the pinned mlx wheels into
# .venv-mlx/ (once) and writes MLX-made checkpoints and results (tests/mlx/setup.sh);
# test_mlx_reference reads them, or skips (77) saying why they could not be made.
add_test(NAME mlx_reference_files
         COMMAND bash ${PROJECT_SOURCE_DIR}/tests/mlx/setup.sh ${PROJECT_BINARY_DIR}/mlx_reference)
set_tests_properties(mlx_reference_files PROPERTIES FIXTURES_SETUP mlx_reference TIMEOUT 900)
set_tests_properties(test_mlx_reference PROPERTIES FIXTURES_REQUIRED mlx_reference
  ENVIRONMENT "METRALE_MLX_REFERENCE=${PROJECT_BINARY_DIR}/mlx_reference")

# libFuzzer on the safetensors and config.json readers: built with clang from the readers' own
# sources (instrumented, unlike the gcc-built library) when clang has libFuzzer; a short run
# from the committed corpus (tests/fuzz/corpus/) is a test. New inputs go to the build folder,
# never into the committed corpus. Skipped in the sanitizer and coverage builds (the fuzz
# binary has its own ASan+UBSan).
find_program(METRALE_CLANG NAMES clang clang-14)
set(METRALE_FUZZ_SECONDS 15 CACHE STRING "Seconds of the fuzz smoke test")
if(METRALE_CLANG AND NOT METRALE_SANITIZE AND NOT METRALE_COVERAGE)
  set(fuzz_probe ${PROJECT_BINARY_DIR}/fuzz_probe.c)
  file(WRITE ${fuzz_probe} "#include <stddef.h>\n#include <stdint.h>\nint LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) { (void)d; (void)n; return 0; }\n")
  execute_process(COMMAND ${METRALE_CLANG} -fsanitize=fuzzer ${fuzz_probe} -o ${PROJECT_BINARY_DIR}/fuzz_probe
                  RESULT_VARIABLE fuzz_probe_result OUTPUT_QUIET ERROR_QUIET)
  if(fuzz_probe_result EQUAL 0)
    set(fuzz_sources ${PROJECT_SOURCE_DIR}/tests/fuzz/fuzz_safetensors.c
        ${PROJECT_SOURCE_DIR}/src/ops/mlx/safetensors.c ${PROJECT_SOURCE_DIR}/src/ops/mlx/mlx_json.c
        ${PROJECT_SOURCE_DIR}/src/ops/mlx/mlx_config.c ${PROJECT_SOURCE_DIR}/src/core/error.c)
    add_custom_command(OUTPUT ${PROJECT_BINARY_DIR}/fuzz_safetensors
      COMMAND ${METRALE_CLANG} -std=c11 -g -O1 -D_GNU_SOURCE -Wall -Wextra -Werror
              -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all
              -I${PROJECT_SOURCE_DIR}/include -I${PROJECT_SOURCE_DIR}/src/core
              -I${PROJECT_SOURCE_DIR}/src/ops/mlx ${fuzz_sources}
              -o ${PROJECT_BINARY_DIR}/fuzz_safetensors
      DEPENDS ${fuzz_sources} COMMENT "Building the safetensors fuzzer with clang" VERBATIM)
    add_custom_target(fuzz_safetensors_build ALL DEPENDS ${PROJECT_BINARY_DIR}/fuzz_safetensors)
    add_test(NAME fuzz_safetensors_smoke
      COMMAND sh -c "mkdir -p fuzz_corpus && exec ./fuzz_safetensors -max_total_time=${METRALE_FUZZ_SECONDS} -seed=1 -max_len=4096 -timeout=10 fuzz_corpus ${PROJECT_SOURCE_DIR}/tests/fuzz/corpus"
      WORKING_DIRECTORY ${PROJECT_BINARY_DIR})
    set_tests_properties(fuzz_safetensors_smoke PROPERTIES TIMEOUT 120)
  else()
    message(STATUS "metrale: clang lacks libFuzzer; no fuzz smoke test")
  endif()
endif()

# The forward model with MLX weights reads the committed checkpoints (tests/mlx/checkpoints/).
target_compile_definitions(test_forward_mlx PRIVATE
  METRALE_MLX_CHECKPOINTS="${PROJECT_SOURCE_DIR}/tests/mlx/checkpoints")

# The same test as a binary moved off its source tree (the GPU machine's case): its compiled-in
# folder does not exist and METRALE_MLX_CHECKPOINTS names a copy of the checkpoints, which
# every case must then open.
add_executable(test_forward_mlx_moved ${PROJECT_SOURCE_DIR}/tests/test_forward_mlx.c)
target_include_directories(test_forward_mlx_moved PRIVATE ${PROJECT_SOURCE_DIR}/tests)
target_link_libraries(test_forward_mlx_moved PRIVATE metrale_check metrale_model)
target_compile_definitions(test_forward_mlx_moved PRIVATE
  METRALE_MLX_CHECKPOINTS="${PROJECT_BINARY_DIR}/no-such-folder")
add_test(NAME mlx_checkpoints_copy
         COMMAND ${CMAKE_COMMAND} -E copy_directory ${PROJECT_SOURCE_DIR}/tests/mlx/checkpoints
                 ${PROJECT_BINARY_DIR}/mlx_checkpoints_copy)
set_tests_properties(mlx_checkpoints_copy PROPERTIES FIXTURES_SETUP mlx_checkpoints_copy)
add_test(NAME test_forward_mlx_moved COMMAND test_forward_mlx_moved)
set_tests_properties(test_forward_mlx_moved PROPERTIES FIXTURES_REQUIRED mlx_checkpoints_copy
  TIMEOUT 600 SKIP_RETURN_CODE 77
  ENVIRONMENT "METRALE_MLX_CHECKPOINTS=${PROJECT_BINARY_DIR}/mlx_checkpoints_copy")
