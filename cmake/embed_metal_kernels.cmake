# The MSL sources of kernels/metal/, embedded in the Metal backend as one string (the device
# compiles them at run time: newLibraryWithSource:options:error:): the shared conversions of
# kernels/metal/common/numerics.metal first, then kernels/metal/*.metal in name order. Sets
# METRALE_METAL_KERNEL_SOURCES (the generated C file), METRALE_METAL_KERNEL_MSL (the same
# source as MSL, for the syntax check) and METRALE_METAL_MSL (the inputs).
file(GLOB METRALE_METAL_MSL CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/kernels/metal/*.metal)
list(SORT METRALE_METAL_MSL)
list(PREPEND METRALE_METAL_MSL ${PROJECT_SOURCE_DIR}/kernels/metal/common/numerics.metal)
set(METRALE_METAL_KERNEL_SOURCES ${PROJECT_BINARY_DIR}/generated/metal_kernel_source.c)
set(METRALE_METAL_KERNEL_MSL ${PROJECT_BINARY_DIR}/generated/metal_kernel_source.metal)
add_custom_command(
  OUTPUT ${METRALE_METAL_KERNEL_SOURCES} ${METRALE_METAL_KERNEL_MSL}
  COMMAND ${CMAKE_COMMAND} "-DINPUTS=${METRALE_METAL_MSL}" -DROOT=${PROJECT_SOURCE_DIR}
          -DOUTPUT=${METRALE_METAL_KERNEL_SOURCES} -DOUTPUT_MSL=${METRALE_METAL_KERNEL_MSL}
          -P ${PROJECT_SOURCE_DIR}/cmake/metal_source_to_c.cmake
  DEPENDS ${METRALE_METAL_MSL} ${PROJECT_SOURCE_DIR}/cmake/metal_source_to_c.cmake
  COMMENT "Embedding the Metal kernels (kernels/metal/)"
  VERBATIM)
