/*
 * metrale/ops_elementwise.h - the small per-row kernels of a decoder forward pass: row gather
 * (token embedding, and the rows of the last tokens before the LM head), RMSNorm with the
 * residual add folded in, and the greedy argmax over logits.
 *
 *   mg_gather_rows_bf16(b, s, tokens, hidden, ids, vocab, embedding, 0, residual);
 *   mg_rmsnorm_bf16(b, s, tokens, hidden, 1e-5f, residual, proj_out, norm_w, norm_out);
 *   mg_argmax_f32(b, s, rows, vocab, logits, vocab, next_ids);   // or mg_argmax_bf16
 *
 * and two helpers for synthetic data (below): mg_fill_uniform_bf16 and mg_amax_bf16.
 *
 * The results are defined by the CPU references (src/ops/elementwise/), in FP32 from the BF16
 * inputs, rounded to BF16 to nearest even once per stored value:
 *   gather:  out[r, c] = src[i, c], or bf16(src[i, c] + add[i, c]) with an add, i = ids[r];
 *            an id outside [0, src_rows) gives a row of zeros (the device cannot report it
 *            without waiting, so it is defined instead).
 *   rmsnorm: with an add, x[r, c] = bf16(x[r, c] + add[r, c]) is written back to x first;
 *            then inv = 1 / sqrtf(sum_c x[r, c]^2 / cols + eps) and
 *            out[r, c] = bf16((x[r, c] * inv) * weight[c]). The sum is accumulated in FP32
 *            in an order of the backend's choosing, so backends may differ by an ulp or two
 *            of FP32 in inv (rarely one BF16 spacing in out).
 *   argmax:  ids[r] = the lowest c with in[r, c] maximal; NaN never wins (a row of NaN gives 0).
 *
 * What a caller may rely on: every argument is checked before anything is launched (a bad
 * shape, pointer, alignment, a buffer too small, a forbidden overlap: MG_ERR_INVALID_ARGUMENT
 * naming it); calls are ordered on `s`, allocate nothing and never wait for the device, so
 * they may be captured into graphs; the same kernels (module "metrale") run on every backend
 * that ships them. BF16 rows are packed (pitch = cols), cols a multiple of 8 and BF16
 * pointers 16-byte aligned (the CUDA kernels move 16 bytes per load).
 */
#ifndef METRALE_OPS_ELEMENTWISE_H
#define METRALE_OPS_ELEMENTWISE_H

#include <stdint.h>

#include "metrale/export.h"
#include "metrale/gpu.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ids: int32 [rows]; src (and add, or 0): BF16 [src_rows, cols]; out: BF16 [rows, cols],
 * not overlapping src or add. */
MG_API mg_status mg_gather_rows_bf16(mg_backend *b, mg_stream *s, uint32_t rows, uint32_t cols,
                                     mg_devptr ids, uint32_t src_rows, mg_devptr src, mg_devptr add,
                                     mg_devptr out);

/* x: BF16 [rows, cols] (updated in place when add is not 0); add: BF16 [rows, cols] or 0;
 * weight: BF16 [cols]; out: BF16 [rows, cols], either x itself (only without an add) or not
 * overlapping x, add and weight. eps finite and >= 0. */
MG_API mg_status mg_rmsnorm_bf16(mg_backend *b, mg_stream *s, uint32_t rows, uint32_t cols,
                                 float eps, mg_devptr x, mg_devptr add, mg_devptr weight,
                                 mg_devptr out);

/* in: FP32 [rows, cols] with a row pitch of `pitch` elements (>= cols), 16-byte aligned with
 * pitch a multiple of 4; ids: int32 [rows], 4-byte aligned, not overlapping in. */
MG_API mg_status mg_argmax_f32(mg_backend *b, mg_stream *s, uint32_t rows, uint32_t cols,
                               mg_devptr in, uint32_t pitch, mg_devptr ids);

/* The same over BF16 logits (e.g. an NVFP4 LM head's output): in BF16 [rows, cols], row pitch
 * a multiple of 8 elements, 16-byte aligned. Ties (more frequent at BF16 precision) go to the
 * lowest column, as for FP32. */
MG_API mg_status mg_argmax_bf16(mg_backend *b, mg_stream *s, uint32_t rows, uint32_t cols,
                                mg_devptr in, uint32_t pitch, mg_devptr ids);

/* ------------------------------------------------------------------ synthetic data
 *
 * Reproducible pseudo-random BF16 values, the same bits on every backend and on the host
 * (the forward model's synthetic weights are made with them, on the device where the backend
 * runs the op, so a large preset is not generated and uploaded by the host):
 *   for i in [0, count):
 *     z = splitmix64(counter + i)     (modulo 2^64; x += 0x9E3779B97F4A7C15, then
 *                                      z = (x ^ x >> 30) * 0xBF58476D1CE4E5B9,
 *                                      z = (z ^ z >> 27) * 0x94D049BB133111EB, z ^= z >> 31)
 *     u = (z >> 40) * 2^-23 - 1       (exact in FP32: 24 random bits, u in [-1, 1))
 *     out[i] = bf16(offset + scale * u)  (one FP32 product, then one FP32 sum, never fused;
 *                                         rounded to nearest even)
 * out: BF16 [count], 16-byte aligned; count >= 1; offset and scale finite. */
MG_API mg_status mg_fill_uniform_bf16(mg_backend *b, mg_stream *s, uint64_t count, uint64_t counter,
                                      float offset, float scale, mg_devptr out);
/* The same values into host memory (out: count elements; no checks, nothing allocated). */
MG_API void mg_uniform_bf16_host(uint64_t counter, float offset, float scale, uint64_t count,
                                 uint16_t *out);

/* out[0] = the largest |x[i]| over the finite values of x (BF16 [count], 16-byte aligned;
 * count >= 1), as FP32 (exact: a BF16 magnitude); +0 when none is finite. out: FP32 [1],
 * 4-byte aligned, not overlapping x. A maximum, so the same on every backend whatever the
 * order. */
MG_API mg_status mg_amax_bf16(mg_backend *b, mg_stream *s, uint64_t count, mg_devptr x,
                              mg_devptr out);

#ifdef __cplusplus
}
#endif
#endif
