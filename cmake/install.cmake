# cmake/install.cmake - `cmake --install BUILD --prefix P` and the tests of what it installs.
#
#   P/include/metrale/*.h                      the public headers
#   P/LIBDIR/libmetrale_gpu.so -> .so.SOVERSION -> .so.VERSION, libmetrale_gpu.a
#   P/LIBDIR/libmetrale_gpu_attention.so       the FlashInfer attention plugin, when it is built
#   P/LIBDIR/libmetrale_gpu_cutlass.so         (and the CUTLASS GEMM plugin, when it is built):
#                                              the CUDA backend dlopens it from the directory of
#                                              libmetrale_gpu.so (src/backends/cuda/cuda_plugin.c)
#   P/LIBDIR/libmetrale_model.so               the model layer (src/model/exports.map), for the
#                                              Python binding
#   P/LIBDIR/cmake/metrale_gpu/                find_package(metrale_gpu): the imported targets
#                                              metrale_gpu::metrale_gpu (shared) and
#                                              metrale_gpu::metrale_gpu_static, and a version file
#   P/LIBDIR/pkgconfig/metrale_gpu.pc          pkg-config (Libs.private for static linking)
#
# LIBDIR and the include directory come from GNUInstallDirs. Included at the end of the top-level
# CMakeLists.txt, once the targets metrale_gpu and metrale_gpu_static exist.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(METRALE_PACKAGE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/metrale_gpu)

# ---------------------------------------------------------------- ABI version
# Before 1.0 every minor release may break the ABI, so the soname and the package
# compatibility follow major.minor; from 1.0 on, the major version alone.
if(PROJECT_VERSION_MAJOR EQUAL 0)
  set(METRALE_SOVERSION ${PROJECT_VERSION_MAJOR}.${PROJECT_VERSION_MINOR})
  set(METRALE_COMPATIBILITY SameMinorVersion)
else()
  set(METRALE_SOVERSION ${PROJECT_VERSION_MAJOR})
  set(METRALE_COMPATIBILITY SameMajorVersion)
endif()
set_target_properties(metrale_gpu PROPERTIES VERSION ${PROJECT_VERSION}
                                             SOVERSION ${METRALE_SOVERSION})

# ---------------------------------------------------------------- usage requirements
# The targets name the source tree's include/ and build-only definitions (METRALE_HAVE_CUDA,
# which no public header reads) as plain values. Those hold in the build tree only: wrap them in
# $<BUILD_INTERFACE:...> so the exported targets carry the installed include directory instead
# (INCLUDES DESTINATION below). Values that already are generator expressions are kept.
foreach(target metrale_gpu metrale_gpu_static)
  foreach(property INTERFACE_INCLUDE_DIRECTORIES INTERFACE_COMPILE_DEFINITIONS)
    get_target_property(values ${target} ${property})
    if(NOT values)
      continue()
    endif()
    set(wrapped "")
    foreach(value IN LISTS values)
      if(value MATCHES "^\\$<")
        list(APPEND wrapped "${value}")
      else()
        list(APPEND wrapped "$<BUILD_INTERFACE:${value}>")
      endif()
    endforeach()
    set_property(TARGET ${target} PROPERTY ${property} "${wrapped}")
  endforeach()
endforeach()

# ---------------------------------------------------------------- headers and libraries
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/metrale
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
        FILES_MATCHING PATTERN "*.h")

install(TARGETS metrale_gpu metrale_gpu_static
        EXPORT metrale_gpuTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})

# The attention plugin goes next to libmetrale_gpu.so, where the library looks for it.
if(TARGET metrale_gpu_attention)
  if(NOT METRALE_ATTENTION_PLUGIN)
    message(FATAL_ERROR "metrale: the target metrale_gpu_attention exists but "
                        "METRALE_ATTENTION_PLUGIN (its file) is not set here")
  endif()
  install(PROGRAMS ${METRALE_ATTENTION_PLUGIN} DESTINATION ${CMAKE_INSTALL_LIBDIR})
endif()
# So does the CUTLASS GEMM plugin.
if(TARGET metrale_gpu_cutlass)
  install(PROGRAMS ${METRALE_CUTLASS_PLUGIN} DESTINATION ${CMAKE_INSTALL_LIBDIR})
endif()
# The model layer's shared library (the Python binding's model.py loads it from there; its
# RUNPATH $ORIGIN finds libmetrale_gpu.so beside it).
install(TARGETS metrale_model_shared LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})

# ---------------------------------------------------------------- CMake package
install(EXPORT metrale_gpuTargets
        NAMESPACE metrale_gpu::
        DESTINATION ${METRALE_PACKAGE_DIR})
configure_package_config_file(
  ${CMAKE_CURRENT_LIST_DIR}/metrale_gpuConfig.cmake.in
  ${PROJECT_BINARY_DIR}/package/metrale_gpuConfig.cmake
  INSTALL_DESTINATION ${METRALE_PACKAGE_DIR})
write_basic_package_version_file(
  ${PROJECT_BINARY_DIR}/package/metrale_gpuConfigVersion.cmake
  VERSION ${PROJECT_VERSION}
  COMPATIBILITY ${METRALE_COMPATIBILITY})
install(FILES ${PROJECT_BINARY_DIR}/package/metrale_gpuConfig.cmake
              ${PROJECT_BINARY_DIR}/package/metrale_gpuConfigVersion.cmake
        DESTINATION ${METRALE_PACKAGE_DIR})

# ---------------------------------------------------------------- pkg-config
# Libs.private: what the static library needs, read from metrale_gpu_static's link interface.
set(METRALE_PC_LIBS_PRIVATE "")
get_target_property(static_deps metrale_gpu_static INTERFACE_LINK_LIBRARIES)
foreach(dep IN LISTS static_deps)
  if(dep MATCHES "^\\$<LINK_ONLY:(.*)>$")
    set(dep "${CMAKE_MATCH_1}")
  endif()
  if(dep STREQUAL "Threads::Threads")
    if(CMAKE_THREAD_LIBS_INIT)
      list(APPEND METRALE_PC_LIBS_PRIVATE "${CMAKE_THREAD_LIBS_INIT}")
    endif()
  elseif(dep MATCHES "^-")
    list(APPEND METRALE_PC_LIBS_PRIVATE "${dep}")
  elseif(TARGET "${dep}" OR dep MATCHES "[$<>:/]")
    message(WARNING "metrale: metrale_gpu.pc cannot express the dependency ${dep}; "
                    "teach cmake/install.cmake about it")
  elseif(dep)
    list(APPEND METRALE_PC_LIBS_PRIVATE "-l${dep}")
  endif()
endforeach()
list(REMOVE_DUPLICATES METRALE_PC_LIBS_PRIVATE)
list(JOIN METRALE_PC_LIBS_PRIVATE " " METRALE_PC_LIBS_PRIVATE)

# The prefix is only known when installing (`cmake --install --prefix P` overrides the configured
# one), so the file is written then, from cmake/metrale_gpu.pc.in, and installed from there.
install(CODE "
set(METRALE_PC_TEMPLATE \"${CMAKE_CURRENT_LIST_DIR}/metrale_gpu.pc.in\")
set(METRALE_PC_STAGE \"${PROJECT_BINARY_DIR}/package/pkgconfig\")
set(METRALE_PC_LIBDIR_REL \"${CMAKE_INSTALL_LIBDIR}\")
set(METRALE_PC_INCLUDEDIR_REL \"${CMAKE_INSTALL_INCLUDEDIR}\")
set(METRALE_PC_VERSION \"${PROJECT_VERSION}\")
set(METRALE_PC_LIBS_PRIVATE \"${METRALE_PC_LIBS_PRIVATE}\")
")
install(CODE [[
set(METRALE_PC_PREFIX "${CMAKE_INSTALL_PREFIX}")
foreach(kind LIBDIR INCLUDEDIR)
  if(IS_ABSOLUTE "${METRALE_PC_${kind}_REL}")
    set(METRALE_PC_${kind} "${METRALE_PC_${kind}_REL}")
  else()
    set(METRALE_PC_${kind} "\${prefix}/${METRALE_PC_${kind}_REL}")
  endif()
endforeach()
# One staging directory per prefix, so installs to different prefixes never share the file.
string(MD5 prefix_hash "${CMAKE_INSTALL_PREFIX}")
set(pc_file "${METRALE_PC_STAGE}/${prefix_hash}/metrale_gpu.pc")
configure_file("${METRALE_PC_TEMPLATE}" "${pc_file}" @ONLY)
if(IS_ABSOLUTE "${METRALE_PC_LIBDIR_REL}")
  set(pc_destination "${METRALE_PC_LIBDIR_REL}/pkgconfig")
else()
  set(pc_destination "${CMAKE_INSTALL_PREFIX}/${METRALE_PC_LIBDIR_REL}/pkgconfig")
endif()
file(INSTALL DESTINATION "${pc_destination}" TYPE FILE FILES "${pc_file}")
]])

# ---------------------------------------------------------------- tests
# exported_symbols: libmetrale_gpu.so exports exactly the MG_API functions of the public headers.
# install_consumer: installs this build into a prefix under the build directory and builds and
# runs tests/consumer against it through find_package and through pkg-config, shared and static.
if(NOT CMAKE_NM)
  find_program(CMAKE_NM nm REQUIRED)
endif()
if(NOT CMAKE_READELF)
  find_program(CMAKE_READELF readelf REQUIRED)
endif()
find_program(METRALE_PKG_CONFIG pkg-config)
if(NOT METRALE_PKG_CONFIG)
  set(METRALE_PKG_CONFIG "")
endif()
set(consumer_flags "")
if(METRALE_SANITIZE)
  # An instrumented library needs an instrumented program: the sanitizer runtime must load
  # first, and the static library's references to it must resolve.
  set(consumer_flags "-fsanitize=${METRALE_SANITIZE} -fno-omit-frame-pointer -fno-sanitize-recover=all")
endif()
set(plugin_expected 0)
if(TARGET metrale_gpu_attention)
  set(plugin_expected 1)
endif()

# The coverage build instruments the library with gcov's runtime (its symbols are exported and
# a consumer would need --coverage too): these tests of the release artifact skip it.
if(NOT METRALE_COVERAGE)
  add_test(NAME exported_symbols
           COMMAND bash ${PROJECT_SOURCE_DIR}/tests/check_exports.sh ${CMAKE_NM}
                   $<TARGET_FILE:metrale_gpu> ${PROJECT_SOURCE_DIR}/include)
  add_test(NAME exported_model_symbols
           COMMAND bash ${PROJECT_SOURCE_DIR}/tests/check_model_exports.sh ${CMAKE_NM}
                   $<TARGET_FILE:metrale_model_shared> ${PROJECT_SOURCE_DIR})
  add_test(NAME install_consumer
           COMMAND bash ${PROJECT_SOURCE_DIR}/tests/install_consumer.sh
                   "--build=${PROJECT_BINARY_DIR}"
                   "--config=$<CONFIG>"
                   "--source=${PROJECT_SOURCE_DIR}/tests/consumer"
                   "--cmake=${CMAKE_COMMAND}"
                   "--generator=${CMAKE_GENERATOR}"
                   "--make-program=${CMAKE_MAKE_PROGRAM}"
                   "--cc=${CMAKE_C_COMPILER}"
                   "--cflags=${consumer_flags}"
                   "--readelf=${CMAKE_READELF}"
                   "--pkg-config=${METRALE_PKG_CONFIG}"
                   "--libdir=${CMAKE_INSTALL_LIBDIR}"
                   "--includedir=${CMAKE_INSTALL_INCLUDEDIR}"
                   "--version=${PROJECT_VERSION}"
                   "--soversion=${METRALE_SOVERSION}"
                   "--plugin=${plugin_expected}")
  # 77: pkg-config is not installed (scripts/setup.sh installs it), so only the CMake half ran.
  set_tests_properties(install_consumer PROPERTIES TIMEOUT 600 SKIP_RETURN_CODE 77)
endif()
