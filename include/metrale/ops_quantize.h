/*
 * metrale/ops_quantize.h - FP8 E4M3 activation quantizers on the device: BF16 [rows, cols]
 * in, E4M3 codes and FP32 scales out, in exactly the layouts the FP8 GEMMs of
 * metrale/ops_gemm.h read, so a quantizer's outputs feed a GEMM directly.
 *
 *   mg_fp8_quant_desc d = {.mode = MG_FP8_QUANT_ROW, .rows = tokens, .cols = 4096};
 *   mg_fp8_quantize(b, s, &d, x_bf16, x_fp8, x_scales);       // x_scales: FP32 [tokens]
 *   mg_gemm_fp8_rowwise(b, s, tokens, n, 4096, x_fp8, x_scales, w_fp8, w_scales, y, n);
 *
 * The result is defined bit for bit by the host quantizers of metrale/ops_gemm.h
 * (mg_fp8_quantize_tensorwise / _rowwise / _1x128), on every backend:
 *   amax  = max |x| over a group's finite values (infinities and NaN are left out);
 *   scale = amax / 448 in IEEE single precision (round to nearest even), 1 when amax is 0;
 *   code  = E4M3 round-to-nearest-even of x / scale (IEEE division), saturating: values
 *           beyond 448 and infinities become +-448 (0x7e / 0xfe); a NaN input gives the NaN
 *           code with its sign (0x7f, 0xff when negative); -0 gives 0x80.
 *
 * What a caller may rely on:
 *  - Arguments are checked before anything is launched: a bad mode, shape, pitch, pointer,
 *    alignment, a buffer too small for its tensor (on backends that know the allocations) or
 *    overlapping buffers are MG_ERR_INVALID_ARGUMENT with a message naming the argument, and
 *    nothing is written.
 *  - The call is ordered on `s` (NULL: the backend's default stream) and returns before the
 *    work is done. Every mode, per-tensor included, runs entirely on the device: the amax is
 *    reduced there and never read back, so nothing waits for the device.
 *  - It allocates no device memory, takes no scratch and never waits for the device, so it may
 *    be captured into a graph, the first call on a backend included (that call looks the
 *    kernels up, host-side, and memoises them). A replay quantizes the input as it is at
 *    replay time.
 *  - The same kernels (module "metrale", names below) run on every backend; the CPU backend's
 *    are the reference.
 *
 * Requirements (rows are moved in 16-byte vectors):
 *  - cols a multiple of 8 (the FP8 GEMMs further need their K, these cols, a multiple of 16),
 *    in_pitch (elements) >= cols and a multiple of 8;
 *  - in, out and scales 16-byte aligned (per-tensor: scales 4-byte aligned), as allocations
 *    are; in must not overlap out or scales, nor out overlap scales.
 *  - Sizes: in spans (rows - 1) * in_pitch + cols BF16 elements; out holds
 *    mg_fp8_quant_output_bytes bytes (row pitch cols); scales holds mg_fp8_quant_scale_count
 *    FP32 values.
 */
#ifndef METRALE_OPS_QUANTIZE_H
#define METRALE_OPS_QUANTIZE_H

#include <stddef.h>
#include <stdint.h>

#include "metrale/export.h"
#include "metrale/gpu.h"
#include "metrale/ops_gemm.h" /* the scale layouts, mg_fp8_rows_padded */

#ifdef __cplusplus
extern "C" {
#endif

/* Which groups share a scale, and where the scales go (L = ceil(cols / 128), the K-blocks). */
typedef enum mg_fp8_quant_mode {
    /* One scale for the whole tensor, its amax reduced on the device: scales[0], as
     * mg_gemm_fp8_tensorwise reads it. The slot doubles as the reduction's accumulator while
     * the call runs, so it must not be read by work ordered concurrently with the call. */
    MG_FP8_QUANT_TENSOR = 0,
    /* One scale per row: scales[rows], as mg_gemm_fp8_rowwise reads act_scale. */
    MG_FP8_QUANT_ROW = 1,
    /* One scale per row per 128 columns, in the natural layout [rows, L], index r * L + g
     * (mg_fp8_quantize_1x128's layout; mg_fp8_act_scales_transpose converts it). */
    MG_FP8_QUANT_1X128 = 2,
    /* The same scales written directly in the layout MG_FP8_BLOCK_1X128 GEMMs read:
     * [L, rows_pad], index g * rows_pad + r. The padding rows rows <= r < rows_pad get zero
     * scales AND zero codes, so `out` ([rows_pad, cols]) and `scales` are a complete
     * activation operand for mg_gemm_fp8_blockscaled with M = rows_pad. */
    MG_FP8_QUANT_1X128_GEMM_LAYOUT = 3,
} mg_fp8_quant_mode;

typedef struct mg_fp8_quant_desc {
    mg_fp8_quant_mode mode;
    uint32_t rows, cols; /* the BF16 input's shape; both >= 1 */
    uint32_t in_pitch;   /* elements from one input row to the next; 0 means cols */
    /* MG_FP8_QUANT_1X128_GEMM_LAYOUT only (0 otherwise): the token count the GEMM runs with,
     * >= rows and a multiple of 4 (mg_fp8_rows_padded(rows) is the least). */
    uint32_t rows_pad;
} mg_fp8_quant_desc;

/* FP32 scales a call with `d` writes: 1, rows, rows * L, or L * rows_pad. 0 when `d` is NULL
 * or its mode unknown. Does not check the rest of `d` (mg_fp8_quantize does). */
MG_API size_t mg_fp8_quant_scale_count(const mg_fp8_quant_desc *d);

/* Bytes of E4M3 codes a call with `d` writes: rows * cols, or rows_pad * cols in the GEMM
 * layout mode. 0 when `d` is NULL or its mode unknown. */
MG_API size_t mg_fp8_quant_output_bytes(const mg_fp8_quant_desc *d);

/* Quantizes BF16 `in` [rows, cols] (row pitch in_pitch) into E4M3 codes `out` [rows, cols]
 * (row pitch cols) and FP32 `scales`, as described above. Kernels, in launch order, with their
 * argument lists (u32 unless said; pointers are device buffers):
 *   MG_FP8_QUANT_TENSOR   fp8_quantize_tensor_reset(scale)
 *                         fp8_quantize_tensor_amax(in, scale, rows, cols, in_pitch)
 *                         fp8_quantize_tensor_codes(in, out, scale, rows, cols, in_pitch)
 *                         fp8_quantize_tensor_finish(scale)
 *   MG_FP8_QUANT_ROW      fp8_quantize_rows(in, out, scales, rows, cols, in_pitch)
 *   MG_FP8_QUANT_1X128*   fp8_quantize_1x128(in, out, scales, rows, rows_out, cols, in_pitch,
 *                                            scale_row_stride, scale_block_stride)
 *                         (rows_out = rows_pad in the GEMM layout, else rows; the scale of
 *                         row r, block g is at r * scale_row_stride + g * scale_block_stride)
 * Per-tensor mode keeps the running amax, as FP32 bits, in scales[0] between its kernels. */
MG_API mg_status mg_fp8_quantize(mg_backend *b, mg_stream *s, const mg_fp8_quant_desc *d,
                                 mg_devptr in, mg_devptr out, mg_devptr scales);

#ifdef __cplusplus
}
#endif
#endif
