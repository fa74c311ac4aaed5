# Run with -P: concatenates the MSL files of INPUTS (a ;-list, in order) into OUTPUT as the
# NUL-terminated `const char mg_metal_kernel_source[]` the Metal backend compiles at run time.
set(text "")
foreach(f ${INPUTS})
  file(READ ${f} part)
  string(APPEND text "// ---- ${f}\n${part}\n")
endforeach()
string(HEX "${text}" hex)
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," body "${hex}")
string(REGEX REPLACE "((0x..,){16})" "\\1\n" body "${body}")
file(WRITE ${OUTPUT} "/* generated from kernels/metal/ by cmake/metal_source_to_c.cmake */\n"
     "const char mg_metal_kernel_source[] = {\n${body}0x00};\n")
