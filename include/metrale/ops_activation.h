/*
 * metrale/ops_activation.h - elementwise activations of an MLP block.
 *
 *   // gate_up[tokens, 2 * inter] = x · W_gate_upᵀ, gate in the first half of each row
 *   mg_silu_mul_bf16(b, s, tokens, inter, gate_up, 2 * inter, h, inter);
 *
 * The result is defined by the CPU reference, in FP32 from the BF16 inputs:
 *   out[r, c] = bf16_rne( silu(g) * u ),  silu(g) = g / (1 + expf(-g)),
 *   g = in[r, c], u = in[r, cols + c],
 * each operation an IEEE single-precision one. The CUDA kernel computes the same expression
 * with CUDA's expf (within 2 ulp of the exact exponential), so an output may differ from the
 * CPU's by one BF16 spacing where the FP32 value lies next to a rounding boundary.
 *
 * What a caller may rely on: arguments are checked before anything is launched (bad shape,
 * pitch, alignment, a buffer too small, overlapping in and out: MG_ERR_INVALID_ARGUMENT
 * naming the argument); the call is ordered on `s`, allocates nothing and never waits for the
 * device, so it may be captured; the same kernel (module "metrale", "silu_mul_bf16") runs on
 * every backend that ships it.
 */
#ifndef METRALE_OPS_ACTIVATION_H
#define METRALE_OPS_ACTIVATION_H

#include <stdint.h>

#include "metrale/export.h"
#include "metrale/gpu.h"

#ifdef __cplusplus
extern "C" {
#endif

/* in: BF16 [rows, 2 * cols] with a row pitch of in_pitch elements (>= 2 * cols); out: BF16
 * [rows, cols] with a row pitch of out_pitch (>= cols). rows, cols >= 1; pointers 2-byte
 * aligned. */
MG_API mg_status mg_silu_mul_bf16(mg_backend *b, mg_stream *s, uint32_t rows, uint32_t cols,
                                  mg_devptr in, uint32_t in_pitch, mg_devptr out,
                                  uint32_t out_pitch);

#ifdef __cplusplus
}
#endif
#endif
