# The MSL sources of kernels/metal/, embedded in the Metal backend as one string (the device
# compiles them at run time: newLibraryWithSource:options:error:). Sets
# METRALE_METAL_KERNEL_SOURCES (the generated C file) and METRALE_METAL_MSL (the inputs).
file(GLOB METRALE_METAL_MSL CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/kernels/metal/*.metal)
list(SORT METRALE_METAL_MSL)
set(METRALE_METAL_KERNEL_SOURCES ${PROJECT_BINARY_DIR}/generated/metal_kernel_source.c)
add_custom_command(
  OUTPUT ${METRALE_METAL_KERNEL_SOURCES}
  COMMAND ${CMAKE_COMMAND} "-DINPUTS=${METRALE_METAL_MSL}" -DOUTPUT=${METRALE_METAL_KERNEL_SOURCES}
          -P ${PROJECT_SOURCE_DIR}/cmake/metal_source_to_c.cmake
  DEPENDS ${METRALE_METAL_MSL} ${PROJECT_SOURCE_DIR}/cmake/metal_source_to_c.cmake
  COMMENT "Embedding the Metal kernels (kernels/metal/*.metal)"
  VERBATIM)
