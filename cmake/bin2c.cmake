# Writes INPUT's bytes as `const unsigned char SYMBOL[]` and `const size_t SYMBOL_bytes`.
file(READ ${INPUT} hex HEX)
string(LENGTH "${hex}" hex_len)
math(EXPR n "${hex_len} / 2")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," body "${hex}")
string(REGEX REPLACE "((0x..,){16})" "\\1\n" body "${body}")
file(WRITE ${OUTPUT} "#include <stddef.h>\n_Alignas(64) const unsigned char ${SYMBOL}[] = {\n${body}\n};\nconst size_t ${SYMBOL}_bytes = ${n};\n")
