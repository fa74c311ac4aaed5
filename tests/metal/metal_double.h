/* metal_double.h - what the Metal test double (metal_double.c) tells a test: the breaches of
 * Metal's rules it saw, the messages it received ("<kind>#<id> <selector>", in order), and the
 * objects still alive of a kind ("buffer", "commandBuffer", ...). A test dlopens the double
 * (already loaded by the backend) and resolves these by name. */
#ifndef METRALE_METAL_DOUBLE_H
#define METRALE_METAL_DOUBLE_H

#include <stddef.h>

size_t metal_double_violations(char *buf, size_t bytes);
void metal_double_reset(void);
size_t metal_double_log_count(void);
const char *metal_double_log_entry(size_t i);
int metal_double_live(const char *kind_name);

#endif
