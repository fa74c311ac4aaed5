# Run with -P: `CLANG -fsyntax-only -x c++` on each of SOURCES against the stand-in MSL header
# in INCLUDE (tests/metal/msl_include/metal_stdlib says what that does and does not prove).
foreach(src ${SOURCES})
  execute_process(
    COMMAND ${CLANG} -fsyntax-only -x c++ -std=c++17 -Wall -Wextra -Werror
            -Wno-unknown-attributes -I ${INCLUDE} ${src}
    RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "MSL syntax check failed: ${src}")
  endif()
  message(STATUS "MSL syntax ok (stand-in header, not Apple's compiler): ${src}")
endforeach()
