/*
 * elementwise_host.h - private to src/ops: the row-wise ops of metrale/ops_elementwise.h on host
 * memory, shared by their CPU kernels (src/ops/elementwise/) and the fused GEMM's reference
 * (src/ops/gemm/), which composes them. Arguments are trusted; nothing here fails.
 */
#ifndef METRALE_ELEMENTWISE_HOST_H
#define METRALE_ELEMENTWISE_HOST_H

#include <stdint.h>

/* rmsnorm and argmax on host memory: the bodies of their CPU kernels, and of the references
 * that compose them (the fused GEMM's). rmsnorm: x, add (may be NULL), out [rows, cols] packed,
 * weight [cols]; with add, x is updated in place as the op states. argmax: `in` of f32
 * (element_bytes 4) or bf16 (2) with row pitch `pitch`, ids [rows]. */
void mg_rmsnorm_bf16_host(uint32_t rows, uint32_t cols, float eps, uint16_t *x, const uint16_t *add,
                          const uint16_t *weight, uint16_t *out);
void mg_argmax_host(uint32_t rows, uint32_t cols, const void *in, uint32_t pitch,
                    unsigned element_bytes, int32_t *ids);

#endif
