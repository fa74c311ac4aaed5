# The Metal backend's tests on a machine without Metal (tests/metal/): the test double of
# libobjc and Metal.framework (x86-64 Linux: its objc_msgSend is x86-64 assembly), the
# conformance suite and the op checks run through it, the message-sequence test, the
# unavailable paths, and the MSL syntax check against a stand-in header.
if(NOT METRALE_METAL)
  return()
endif()
find_program(METRALE_CLANG14 NAMES clang-14)
if(METRALE_CLANG14)
  # What this proves is said in tests/metal/msl_include/metal_stdlib: C++ well-formedness
  # against declared built-ins, not acceptance by Apple's compiler. It compiles the one source
  # the backend embeds (every file together, as the device does), so a name defined in two
  # files fails here as it would on a Mac.
  add_test(NAME metal_msl_syntax
    COMMAND ${CMAKE_COMMAND} -DCLANG=${METRALE_CLANG14}
            -DINCLUDE=${PROJECT_SOURCE_DIR}/tests/metal/msl_include
            -DSOURCES=${METRALE_METAL_KERNEL_MSL}
            -P ${PROJECT_SOURCE_DIR}/cmake/metal_msl_syntax.cmake)
  set_tests_properties(metal_msl_syntax PROPERTIES LABELS metal)
endif()
if(NOT (CMAKE_SYSTEM_NAME STREQUAL "Linux" AND CMAKE_SYSTEM_PROCESSOR MATCHES "x86_64|AMD64"))
  return()
endif()
enable_language(ASM)
add_library(metal_double SHARED tests/metal/metal_double.c tests/metal/objc_msgSend_x86_64.S)
target_include_directories(metal_double PRIVATE ${METRALE_PUBLIC_INCLUDE}
  ${PROJECT_SOURCE_DIR}/tests/metal)
# Kernels run in a private copy of the shared library (the CPU reference kernels).
target_compile_definitions(metal_double PRIVATE
  METRALE_DOUBLE_REFERENCE_LIBRARY="$<TARGET_FILE:metrale_gpu>")
target_link_libraries(metal_double PRIVATE ${CMAKE_DL_LIBS} Threads::Threads)
add_dependencies(metal_double metrale_gpu)
set(METRALE_METAL_DOUBLE_ENV
    "METRALE_METAL_OBJC_LIBRARY=$<TARGET_FILE:metal_double>"
    "METRALE_METAL_FRAMEWORK=$<TARGET_FILE:metal_double>")

foreach(t test_metal_sequence test_metal_unavailable test_metal_kv_append)
  add_executable(${t} tests/metal/${t}.c)
  target_link_libraries(${t} PRIVATE metrale_gpu_static m)
  add_dependencies(${t} metal_double)
endforeach()
add_test(NAME metal_sequence COMMAND test_metal_sequence)
add_test(NAME metal_kv_append COMMAND test_metal_kv_append)
add_test(NAME metal_unavailable_nolib COMMAND test_metal_unavailable nolib)
add_test(NAME metal_unavailable_nodevice COMMAND test_metal_unavailable nodevice)
add_test(NAME conformance_metal COMMAND test_conformance)
# Every check on Metal: the ops it has no kernel or provider for are reported skipped, naming
# the op (src/check/registry.c's table), so nothing is hand-picked here.
# Instrumented builds leave out the slow cases, as cli_check_cpu does.
if(METRALE_SANITIZE OR METRALE_COVERAGE)
  add_test(NAME cli_check_metal COMMAND metrale-gpu --backend metal check --skip-tag slow)
else()
  add_test(NAME cli_check_metal COMMAND metrale-gpu --backend metal check)
endif()
set_tests_properties(cli_check_metal PROPERTIES TIMEOUT 3600)
set(METRALE_METAL_CHECK_TESTS cli_check_metal)
# mg_sample's every check (test_sample) on Metal: kernels/metal/sample.metal's argument list.
add_test(NAME sample_metal COMMAND test_sample metal)
list(APPEND METRALE_METAL_CHECK_TESTS sample_metal)
# The forward pass of MLX 4/8-bit and BF16 presets against the CPU, and the up-front refusals.
add_test(NAME cli_run_compare_metal
         COMMAND ${PROJECT_SOURCE_DIR}/tests/run_compare_metal.sh $<TARGET_FILE:metrale-gpu>)
list(APPEND METRALE_METAL_CHECK_TESTS cli_run_compare_metal)
add_test(NAME cli_info_metal COMMAND metrale-gpu info)
# --json: the Metal backend's entry carries the marker too (its note), not only its driver.
add_test(NAME cli_info_metal_json COMMAND metrale-gpu --json info)
list(APPEND METRALE_METAL_CHECK_TESTS cli_info_metal_json)
set_tests_properties(metal_sequence metal_kv_append conformance_metal ${METRALE_METAL_CHECK_TESTS} cli_info_metal
  PROPERTIES
  ENVIRONMENT "${METRALE_METAL_DOUBLE_ENV}" LABELS metal)
set_tests_properties(metal_unavailable_nolib PROPERTIES LABELS metal
  ENVIRONMENT "METRALE_METAL_OBJC_LIBRARY=${PROJECT_BINARY_DIR}/no-such-dir/libobjc.A.dylib")
set_tests_properties(metal_unavailable_nodevice PROPERTIES LABELS metal
  ENVIRONMENT "${METRALE_METAL_DOUBLE_ENV};METRALE_METAL_DOUBLE_NO_DEVICE=1")
# info says what it found; through the double the Metal line must say UNVERIFIED ON HARDWARE.
set_tests_properties(cli_info_metal PROPERTIES PASS_REGULAR_EXPRESSION "UNVERIFIED ON HARDWARE")
set_tests_properties(cli_info_metal_json PROPERTIES PASS_REGULAR_EXPRESSION
  "\"name\": \"metal\", [^}]*\"note\": \"UNVERIFIED ON HARDWARE\"")
