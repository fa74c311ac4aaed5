# Run with -P: concatenates the MSL files of INPUTS (a ;-list, in order; paths under ROOT) into
# the one source the Metal backend compiles at run time, each part opened by a #line directive
# so that a compiler's message names the file it came from. Writes it as MSL (OUTPUT_MSL, what
# the syntax check compiles) and as the NUL-terminated `const char mg_metal_kernel_source[]`
# (OUTPUT, compiled into the backend).
set(text "")
foreach(f ${INPUTS})
  file(READ ${f} part)
  file(RELATIVE_PATH name ${ROOT} ${f})
  string(APPEND text "#line 1 \"${name}\"\n${part}\n")
endforeach()
file(WRITE ${OUTPUT_MSL} "${text}")
string(HEX "${text}" hex)
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," body "${hex}")
string(REGEX REPLACE "((0x..,){16})" "\\1\n" body "${body}")
file(WRITE ${OUTPUT} "/* generated from kernels/metal/ by cmake/metal_source_to_c.cmake */\n"
     "const char mg_metal_kernel_source[] = {\n${body}0x00};\n")
