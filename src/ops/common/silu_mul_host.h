/*
 * silu_mul_host.h - private to src/ops: the SiLU-and-multiply of metrale/ops_activation.h on one
 * element pair, the definition of its result. Shared by its CPU kernel (src/ops/activation/) and
 * the references that fuse it: the GEMM's SiLU-mul epilogue (src/ops/gemm/) and the grouped MoE
 * GEMM (src/ops/moe_gemm/).
 */
#ifndef METRALE_SILU_MUL_HOST_H
#define METRALE_SILU_MUL_HOST_H

#include <stdint.h>

/* silu(gate) * up: BF16 in, FP32 arithmetic (expf), BF16 out rounded once. */
uint16_t mg_silu_mul_reference_one(uint16_t gate, uint16_t up);

#endif
