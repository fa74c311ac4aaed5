/*
 * metrale/nvfp4.h - NVFP4 weight format tools: quantize BF16 weights, dequantize them, move a
 * packed weight between the [K, N] and [N, K] layouts, swizzle block scales into the Blackwell
 * scale-factor layout and back, and import the two checkpoint conventions.
 *
 * The canonical NVFP4 weight of this library ("ModelOpt" convention), for W of N rows
 * (output features) and K columns (input features, the reduction dimension):
 *  - packed  u8 [N, K/2], row-major, K contiguous. Byte (n, i) holds W[n, 2i] in its low
 *            nibble and W[n, 2i+1] in its high nibble. A nibble is bit 3 = sign, bits 0-2 =
 *            E2M1 magnitude code c: c = 0..7 -> {0, 0.5, 1, 1.5, 2, 3, 4, 6}.
 *  - scales  u8 [N, K/16], row-major: one E4M3 ("e4m3fn", bias 7, 3 mantissa bits) block scale
 *            per 16 consecutive K elements of a row. Quantizers write codes 0x00..0x7e only
 *            (sign bit 0); readers decode all 8 bits as E4M3 (0x7f/0xff are NaN).
 *  - global  one FP32 that MULTIPLIES:  W[n, k] = e2m1(q) * e4m3(scale) * global, evaluated as
 *            (e2m1(q) * e4m3(scale)) * global in IEEE single precision (the first product is
 *            exact), rounded to nearest even.
 * K must be a multiple of 16 everywhere in this header (MG_ERR_INVALID_ARGUMENT otherwise).
 *
 * Quantization rule (mg_nvfp4_quantize; the CPU and CUDA backends agree bit for bit), for each
 * 16-element block of a row, all arithmetic IEEE single precision, round to nearest even:
 *   amax  = max |x| over the block's FINITE values (infinities and NaN are left out; 0 if none);
 *   s     = (amax / 6) / global                                  (two divisions, in that order)
 *   scale = E4M3 code of s, round to nearest even, saturating at 448 (0x7e); s not > 0 (amax 0,
 *           or a global of +inf) gives scale 0; s infinite (a positive global too small for
 *           amax) gives 0x7e; a global that is not > 0 (+0, -0, negative, NaN) gives scale 0
 *           in every block, so the whole weight quantizes to zero (the global is read on the
 *           device when the call runs, so it cannot be refused when the call is made);
 *   d     = e4m3(scale) * global;       each value x -> nibble:
 *           scale 0                  -> 0;
 *           m = |x| / d, NaN x       -> 0 (E2M1 has no NaN: a NaN weight becomes +0);
 *           m <= 0.25 -> 0, < 0.75 -> 0.5, <= 1.25 -> 1, < 1.75 -> 1.5, <= 2.5 -> 2, < 3.5 -> 3,
 *           <= 5 -> 4, else (infinities included) 6    (round to nearest, ties to the even code:
 *           0.25 -> 0, 0.75 -> 1, 1.25 -> 1, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4, 5 -> 4);
 *           the sign bit is x's sign, except that a magnitude of 0 is always stored as 0x0.
 * `global` is read on the device (an FP32 in device memory), so a graph replay quantizes with
 * the value current at replay time. mg_nvfp4_global_scale computes the usual choice on the host.
 *
 * What a caller may rely on (every device call below):
 *  - Arguments are checked before anything is launched: a bad shape, pitch, null or misaligned
 *    pointer, a buffer too small for its tensor (on backends that know the allocations) or
 *    overlapping input and output are MG_ERR_INVALID_ARGUMENT with a message naming the
 *    argument, and nothing is written.
 *  - The call is ordered on `s` (NULL: the backend's default stream), allocates nothing, takes
 *    no scratch and never waits for the device, so it may be captured into a graph.
 *  - The same kernels (module "metrale", op MG_OP_NVFP4_FORMAT "nvfp4_format", provider
 *    "kernels") run on every backend; the CPU backend's are the reference. Kernels:
 *      nvfp4_quantize(in, global, packed, scales, u32 n, u32 k, u32 in_pitch)
 *      nvfp4_dequantize_bf16(packed, scales, global, out, u32 n, u32 k)
 *      nvfp4_dequantize_f32(packed, scales, global, out, u32 n, u32 k)
 *      nvfp4_transpose_nibbles(in, out, u32 rows, u32 cols)   in [rows, cols/2] -> out [cols,
 * rows/2] nvfp4_transpose_bytes(in, out, u32 rows, u32 cols)     in [rows, cols]   -> out [cols,
 * rows] nvfp4_scales_swizzle(in, out, u32 rows, u32 cols)      [rows, cols] -> swizzled
 *      nvfp4_scales_unswizzle(in, out, u32 rows, u32 cols)    swizzled -> [rows, cols]
 *  - Alignment: BF16/FP32 tensors 16-byte aligned (and in_pitch a multiple of 8 elements),
 *    packed weights 8-byte aligned for quantize and dequantize (the transposes move bytes and
 *    take any alignment), swizzled scales 16-byte aligned, other byte tensors any.
 */
#ifndef METRALE_NVFP4_H
#define METRALE_NVFP4_H

#include <stddef.h>
#include <stdint.h>

#include "metrale/dtype.h"
#include "metrale/export.h"
#include "metrale/gpu.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MG_NVFP4_BLOCK 16u         /* K elements per block scale */
#define MG_NVFP4_E2M1_MAX 6.0f     /* largest E2M1 magnitude */
#define MG_NVFP4_SF_TILE_ROWS 128u /* Blackwell scale-factor tile: 128 rows x 4 scale columns */
#define MG_NVFP4_SF_TILE_COLS 4u

/* ------------------------------------------------------------------ sizes */

/* Bytes of a packed weight [n, k/2] and of its block scales [n, k/16]. 0 when k is not a
 * multiple of 16 or the size overflows. */
MG_API size_t mg_nvfp4_packed_bytes(uint32_t n, uint32_t k);
MG_API size_t mg_nvfp4_scale_bytes(uint32_t n, uint32_t k);

/* Bytes of the block scales of [n, k] in the Blackwell layout: n rounded up to 128 times k/16
 * rounded up to 4. 0 when k is not a multiple of 16 or on overflow. */
MG_API size_t mg_nvfp4_swizzled_scale_bytes(uint32_t n, uint32_t k);

/* The byte offset of block scale (row, col) (col = k / 16) in the Blackwell layout of a scale
 * matrix with `cols` scale columns (k/16): tiles of 128 rows x 4 columns (512 bytes), ordered
 * row-tile-major with the column-tile index fastest; inside a tile
 *   offset = (row % 32) * 16 + ((row % 128) / 32) * 4 + col % 4.
 * Padding rows (n <= row < round_up(n, 128)) and columns (cols <= col < round_up(cols, 4))
 * hold zeros. */
MG_API size_t mg_nvfp4_swizzled_offset(uint32_t row, uint32_t col, uint32_t cols);

/* ------------------------------------------------------------------ host helpers */

/* The usual global scale of a tensor: amax / (448 * 6) in single precision, where amax is the
 * largest finite |x| of `x` (BF16 [n, k], row pitch `pitch` elements, 0 = k); 1.0 when amax is
 * 0 (an all-zero or all-non-finite tensor, whose block scales are then all 0). With it the
 * largest block's scale is about 448. Host memory; x must hold (n-1)*pitch + k elements. */
MG_API float mg_nvfp4_global_scale(const uint16_t *x, uint32_t n, uint32_t k, uint32_t pitch);

/* The same from a known amax: amax / 2688, or 1 when amax is not > 0 or not finite. */
MG_API float mg_nvfp4_global_scale_from_amax(float amax);

/* The E2M1 magnitude of nibble bits 0-2 ({0, .5, 1, 1.5, 2, 3, 4, 6}), signed by bit 3. */
MG_API float mg_nvfp4_e2m1_to_f32(uint8_t nibble);

/* ------------------------------------------------------------------ device tools */

/* Quantizes BF16 `in` [n, k] (row pitch in_pitch elements, 0 = k; a multiple of 8, >= k) with
 * the FP32 multiplier at `global` (device, 4-byte aligned) into `packed` [n, k/2] and `scales`
 * [n, k/16], by the rule above. n >= 1, k >= 16 a multiple of 16. */
MG_API mg_status mg_nvfp4_quantize(mg_backend *b, mg_stream *s, uint32_t n, uint32_t k,
                                   uint32_t in_pitch, mg_devptr in, mg_devptr global,
                                   mg_devptr packed, mg_devptr scales);

/* Dequantizes `packed` [n, k/2] + `scales` [n, k/16] + `global` (device FP32) into `out`
 * [n, k] (contiguous) of `out_dtype` MG_DTYPE_F32 (the FP32 value of the formula above) or
 * MG_DTYPE_BF16 (that value rounded to nearest even; NaN stays a quiet NaN with its sign). */
MG_API mg_status mg_nvfp4_dequantize(mg_backend *b, mg_stream *s, uint32_t n, uint32_t k,
                                     mg_devptr packed, mg_devptr scales, mg_devptr global,
                                     mg_dtype out_dtype, mg_devptr out);

/* Which way mg_nvfp4_transpose moves a weight W of N output rows and K input columns. */
typedef enum mg_nvfp4_transpose_dir {
    /* From the [K, N] storage some checkpoints use -- packed u8 [K, N/2] (byte (k, j) holds
     * W^T[k, 2j] low, W^T[k, 2j+1] high, i.e. W[2j, k] and W[2j+1, k]) with scales [K/16, N]
     * (scale (g, n) covers W[n, 16g .. 16g+15]) -- to the canonical packed [N, K/2] and scales
     * [N, K/16]. */
    MG_NVFP4_KN_TO_NK = 0,
    /* The inverse: canonical [N, K/2] + [N, K/16] to [K, N/2] + [K/16, N]. */
    MG_NVFP4_NK_TO_KN = 1,
} mg_nvfp4_transpose_dir;

/* Transposes a packed weight and its scales (see mg_nvfp4_transpose_dir). Nibbles move
 * unchanged. n even and >= 2, k >= 16 a multiple of 16. The two directions are exact inverses. */
MG_API mg_status mg_nvfp4_transpose(mg_backend *b, mg_stream *s, mg_nvfp4_transpose_dir dir,
                                    uint32_t n, uint32_t k, mg_devptr packed_in,
                                    mg_devptr scales_in, mg_devptr packed_out,
                                    mg_devptr scales_out);

/* Canonical scales [n, k/16] -> the Blackwell layout (mg_nvfp4_swizzled_offset), every byte
 * of mg_nvfp4_swizzled_scale_bytes(n, k) written (padding 0). `swizzled` 16-byte aligned. */
MG_API mg_status mg_nvfp4_scales_swizzle(mg_backend *b, mg_stream *s, uint32_t n, uint32_t k,
                                         mg_devptr scales, mg_devptr swizzled);

/* The inverse: the Blackwell layout -> canonical scales [n, k/16] (padding ignored). */
MG_API mg_status mg_nvfp4_scales_unswizzle(mg_backend *b, mg_stream *s, uint32_t n, uint32_t k,
                                           mg_devptr swizzled, mg_devptr scales);

/* ------------------------------------------------------------------ checkpoint importers */

/* A tensor as a checkpoint file holds it (e.g. a safetensors entry), in host memory. */
typedef struct mg_nvfp4_tensor_view {
    const void *data;
    mg_dtype dtype;    /* as stored: MG_DTYPE_U8, MG_DTYPE_FP8_E4M3 (U8 accepted), MG_DTYPE_F32 */
    uint32_t rank;     /* 0 (scalar), 1 or 2 */
    uint64_t shape[2]; /* the first `rank` entries */
} mg_nvfp4_tensor_view;

/* What an importer found: the weight's shape and its canonical global multiplier. */
typedef struct mg_nvfp4_import_info {
    uint32_t n, k;
    float global_scale;
} mg_nvfp4_import_info;

/* A checkpoint's scalar (a global, or an activation scale: ModelOpt's input_scale,
 * compressed-tensors' input_global_scale): one F32 value (rank 0, or rank 1 of 1 element),
 * finite and > 0, into *value (may be NULL). MG_ERR_INVALID_ARGUMENT naming `name` otherwise. */
MG_API mg_status mg_nvfp4_import_scalar(const mg_nvfp4_tensor_view *t, const char *name,
                                        float *value);

/* ModelOpt: `weight` U8 [N, K/2], `weight_scale` F8_E4M3 [N, K/16], `weight_scale_2` F32
 * scalar (rank 0, or rank 1 of 1 element), the multiplier itself. Checks dtypes, shapes
 * (K = 2 * weight.shape[1], a multiple of 16, matching weight_scale), that the global scale
 * is finite and > 0 (mg_nvfp4_import_scalar), and that every block scale is one this format
 * writes (sign bit clear, not NaN: bytes 0x00-0x7e; a checkpoint's scales with the sign set
 * would decode differently on hardware that reads them as unsigned), then copies the packed bytes
 * to `packed` and the scales to `scales` (capacities in bytes; both NULL with 0 capacities only
 * fills `info`) and fills `info`. The layouts are the canonical ones, so the bytes are copied
 * unchanged. */
MG_API mg_status mg_nvfp4_import_modelopt(const mg_nvfp4_tensor_view *weight,
                                          const mg_nvfp4_tensor_view *weight_scale,
                                          const mg_nvfp4_tensor_view *weight_scale_2,
                                          uint8_t *packed, size_t packed_capacity, uint8_t *scales,
                                          size_t scales_capacity, mg_nvfp4_import_info *info);

/* compressed-tensors ("nvfp4-pack-quantized"): `weight_packed` U8 [N, K/2] (same nibble order),
 * `weight_scale` F8_E4M3 [N, K/16] and `weight_global_scale` F32 scalar, which DIVIDES: the
 * canonical multiplier is info->global_scale = 1.0f / weight_global_scale (one IEEE single
 * division, as vLLM applies it). Same checks and outputs as mg_nvfp4_import_modelopt. */
MG_API mg_status mg_nvfp4_import_compressed_tensors(const mg_nvfp4_tensor_view *weight_packed,
                                                    const mg_nvfp4_tensor_view *weight_scale,
                                                    const mg_nvfp4_tensor_view *weight_global_scale,
                                                    uint8_t *packed, size_t packed_capacity,
                                                    uint8_t *scales, size_t scales_capacity,
                                                    mg_nvfp4_import_info *info);

#ifdef __cplusplus
}
#endif
#endif
