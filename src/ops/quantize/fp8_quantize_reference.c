/* fp8_quantize_reference.c - the CPU reference of mg_fp8_quantize (fp8_quantize_reference.h):
 * the op on host memory, and the CPU kernels that run it stage by stage under the CUDA
 * kernels' names and argument lists. Both call the same stage functions below, which are
 * built on the rule of src/ops/common/fp8_quantize_host.h. */
#include "fp8_quantize_reference.h"

#include <pthread.h>
#include <stdbool.h>
#include <string.h>

#include "checked_math.h"
#include "cpu_kernels.h"
#include "error.h"
#include "fp8_quantize_host.h"
#include "metrale/launch.h"
#include "metrale/ops_gemm.h"

/* ------------------------------------------------------------------ stages */

static mg_fp8_region whole(uint32_t rows, uint32_t cols) {
    return (mg_fp8_region){0, rows, 0, cols};
}

/* Per-tensor mode keeps the running amax in the scale slot between its kernels, as the CUDA
 * kernels do (there as FP32 bits raised with atomicMax; a max of finite non-negative values is
 * exact in any order, so the bits agree). */
static void tensor_reset(float *slot) {
    *slot = 0.0f;
}

static void tensor_amax(const uint16_t *in, uint32_t rows, uint32_t cols, uint32_t in_pitch,
                        float *slot) {
    *slot = mg_fp8_region_amax(in, in_pitch, whole(rows, cols), *slot);
}

static void tensor_codes(const uint16_t *in, uint8_t *out, const float *slot, uint32_t rows,
                         uint32_t cols, uint32_t in_pitch) {
    mg_fp8_region_quantize(in, in_pitch, out, cols, whole(rows, cols),
                           mg_fp8_scale_from_amax(*slot));
}

static void tensor_finish(float *slot) {
    *slot = mg_fp8_scale_from_amax(*slot);
}

static void quantize_rows(const uint16_t *in, uint8_t *out, float *scales, uint32_t rows,
                          uint32_t cols, uint32_t in_pitch) {
    mg_fp8_quantize_tiles(in, in_pitch, rows, cols, out, scales, (mg_fp8_tiling){1, cols, 1, 1});
}

/* Rows [rows, rows_out) are the GEMM layout's padding: zero codes and zero scales. */
static void quantize_1x128(const uint16_t *in, uint8_t *out, float *scales, uint32_t rows,
                           uint32_t rows_out, uint32_t cols, uint32_t in_pitch, uint32_t row_stride,
                           uint32_t block_stride) {
    mg_fp8_quantize_tiles(in, in_pitch, rows, cols, out, scales,
                          (mg_fp8_tiling){1, MG_FP8_SCALE_BLOCK, row_stride, block_stride});
    uint32_t blocks = mg_fp8_k_blocks(cols);
    for (uint32_t r = rows; r < rows_out; r++) {
        memset(out + (size_t)r * cols, 0, cols);
        for (uint32_t g = 0; g < blocks; g++)
            scales[(size_t)r * row_stride + (size_t)g * block_stride] = 0.0f;
    }
}

/* ------------------------------------------------------------------ the op on host memory */

mg_fp8_quant_1x128_layout mg_fp8_quant_1x128_layout_of(const mg_fp8_quant_desc *d) {
    if (d->mode == MG_FP8_QUANT_1X128_GEMM_LAYOUT)
        return (mg_fp8_quant_1x128_layout){d->rows_pad, 1, d->rows_pad};
    return (mg_fp8_quant_1x128_layout){d->rows, mg_fp8_k_blocks(d->cols), 1};
}

void mg_fp8_quantize_reference(const mg_fp8_quant_desc *d, const uint16_t *in, uint8_t *out,
                               float *scales) {
    uint32_t pitch = d->in_pitch ? d->in_pitch : d->cols;
    switch (d->mode) {
    case MG_FP8_QUANT_TENSOR:
        tensor_reset(scales);
        tensor_amax(in, d->rows, d->cols, pitch, scales);
        tensor_codes(in, out, scales, d->rows, d->cols, pitch);
        tensor_finish(scales);
        return;
    case MG_FP8_QUANT_ROW:
        quantize_rows(in, out, scales, d->rows, d->cols, pitch);
        return;
    case MG_FP8_QUANT_1X128:
    case MG_FP8_QUANT_1X128_GEMM_LAYOUT: {
        mg_fp8_quant_1x128_layout layout = mg_fp8_quant_1x128_layout_of(d);
        quantize_1x128(in, out, scales, d->rows, layout.rows_out, d->cols, pitch, layout.row_stride,
                       layout.block_stride);
        return;
    }
    }
}

/* ------------------------------------------------------------------ CPU kernels */

/* The kernels check their argument list and resolve every buffer with the bytes they touch and
 * the alignment the CUDA kernels' 16-byte accesses need, so a bad launch is an error naming
 * the kernel, never an out-of-bounds access. Spans that overflow become UINT64_MAX, which no
 * buffer holds. */

static uint64_t bf16_span(uint32_t rows, uint32_t cols, uint32_t pitch) {
    size_t span;
    return mg_matrix_span_bytes(rows, cols, pitch, 2, &span) ? span : UINT64_MAX;
}

static uint64_t codes_span(uint32_t rows, uint32_t cols) {
    size_t span;
    return mg_mul_size(rows, cols, &span) ? span : UINT64_MAX;
}

/* Bytes from scales[0] to one past the last scale of `rows` rows and `blocks` K-blocks. */
static uint64_t strided_scales_span(uint32_t rows, uint32_t row_stride, uint32_t blocks,
                                    uint32_t block_stride) {
    if (rows == 0 || blocks == 0)
        return 0;
    /* Each product of two 32-bit values fits in 64 bits; their sum may not. */
    uint64_t last;
    if (__builtin_add_overflow((uint64_t)(rows - 1) * row_stride,
                               (uint64_t)(blocks - 1) * block_stride, &last) ||
        last >= UINT64_MAX / 4)
        return UINT64_MAX;
    return (last + 1) * 4;
}

/* The single argument of fp8_quantize_tensor_reset and _finish: the scale slot. */
static mg_status resolve_slot(const mg_launch *l, const char *name, void **slot) {
    static const mg_arg_kind kinds[] = {MG_ARG_BUFFER};
    mg_status st = mg_cpu_kernel_check_args(l, name, kinds, 1);
    return st ? st : mg_cpu_kernel_buffer(l, 0, 4, 4, name, slot);
}

/* The arguments (in, [out,] scales; u32 rows, cols, in_pitch) of fp8_quantize_tensor_amax,
 * _tensor_codes and fp8_quantize_rows, resolved: in spans its rows, out holds rows x cols codes,
 * scales one FP32 per row (`scale_per_row`) or the per-tensor slot. */
typedef struct row_launch {
    uint32_t rows, cols, pitch;
    void *in, *out, *scales;
} row_launch;

static mg_status resolve_row_launch(const mg_launch *l, const char *name, bool has_out,
                                    bool scale_per_row, row_launch *a) {
    const uint32_t buffers = has_out ? 3 : 2;
    mg_arg_kind kinds[6];
    for (uint32_t i = 0; i < buffers + 3; i++)
        kinds[i] = i < buffers ? MG_ARG_BUFFER : MG_ARG_U32;
    mg_status st = mg_cpu_kernel_check_args(l, name, kinds, buffers + 3);
    if (st)
        return st;
    a->rows = mg_launch_get_u32(l, buffers);
    a->cols = mg_launch_get_u32(l, buffers + 1);
    a->pitch = mg_launch_get_u32(l, buffers + 2);
    a->out = NULL;
    if ((st =
             mg_cpu_kernel_buffer(l, 0, bf16_span(a->rows, a->cols, a->pitch), 16, name, &a->in)) ||
        (has_out &&
         (st = mg_cpu_kernel_buffer(l, 1, codes_span(a->rows, a->cols), 16, name, &a->out))))
        return st;
    return scale_per_row
               ? mg_cpu_kernel_buffer(l, buffers - 1, (uint64_t)a->rows * 4, 16, name, &a->scales)
               : mg_cpu_kernel_buffer(l, buffers - 1, 4, 4, name, &a->scales);
}

static mg_status kernel_tensor_reset(const mg_launch *l) {
    void *slot;
    mg_status st = resolve_slot(l, "metrale:" MG_FP8_QUANTIZE_KERNEL_TENSOR_RESET, &slot);
    if (!st)
        tensor_reset(slot);
    return st;
}

static mg_status kernel_tensor_amax(const mg_launch *l) {
    row_launch a;
    mg_status st =
        resolve_row_launch(l, "metrale:" MG_FP8_QUANTIZE_KERNEL_TENSOR_AMAX, false, false, &a);
    if (!st)
        tensor_amax(a.in, a.rows, a.cols, a.pitch, a.scales);
    return st;
}

static mg_status kernel_tensor_codes(const mg_launch *l) {
    row_launch a;
    mg_status st =
        resolve_row_launch(l, "metrale:" MG_FP8_QUANTIZE_KERNEL_TENSOR_CODES, true, false, &a);
    if (!st)
        tensor_codes(a.in, a.out, a.scales, a.rows, a.cols, a.pitch);
    return st;
}

static mg_status kernel_tensor_finish(const mg_launch *l) {
    void *slot;
    mg_status st = resolve_slot(l, "metrale:" MG_FP8_QUANTIZE_KERNEL_TENSOR_FINISH, &slot);
    if (!st)
        tensor_finish(slot);
    return st;
}

static mg_status kernel_rows(const mg_launch *l) {
    row_launch a;
    mg_status st = resolve_row_launch(l, "metrale:" MG_FP8_QUANTIZE_KERNEL_ROWS, true, true, &a);
    if (!st)
        quantize_rows(a.in, a.out, a.scales, a.rows, a.cols, a.pitch);
    return st;
}

static mg_status kernel_1x128(const mg_launch *l) {
    static const char name[] = "metrale:" MG_FP8_QUANTIZE_KERNEL_1X128;
    static const mg_arg_kind kinds[] = {MG_ARG_BUFFER, MG_ARG_BUFFER, MG_ARG_BUFFER,
                                        MG_ARG_U32,    MG_ARG_U32,    MG_ARG_U32,
                                        MG_ARG_U32,    MG_ARG_U32,    MG_ARG_U32};
    mg_status st = mg_cpu_kernel_check_args(l, name, kinds, 9);
    if (st)
        return st;
    uint32_t rows = mg_launch_get_u32(l, 3), rows_out = mg_launch_get_u32(l, 4);
    uint32_t cols = mg_launch_get_u32(l, 5), pitch = mg_launch_get_u32(l, 6);
    uint32_t row_stride = mg_launch_get_u32(l, 7), block_stride = mg_launch_get_u32(l, 8);
    if (rows_out < rows)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "cpu kernel %s: rows_out=%u is less than rows=%u",
                        name, rows_out, rows);
    uint64_t scale_bytes =
        strided_scales_span(rows_out, row_stride, mg_fp8_k_blocks(cols), block_stride);
    void *in, *out, *scales;
    if (!(st = mg_cpu_kernel_buffer(l, 0, bf16_span(rows, cols, pitch), 16, name, &in)) &&
        !(st = mg_cpu_kernel_buffer(l, 1, codes_span(rows_out, cols), 16, name, &out)) &&
        !(st = mg_cpu_kernel_buffer(l, 2, scale_bytes, 16, name, &scales)))
        quantize_1x128(in, out, scales, rows, rows_out, cols, pitch, row_stride, block_stride);
    return st;
}

static void register_kernels(void) {
    /* Failure is out of host memory at start-up; the lookups then report NOT_FOUND. */
    mg_cpu_kernel_register("metrale", MG_FP8_QUANTIZE_KERNEL_TENSOR_RESET, kernel_tensor_reset);
    mg_cpu_kernel_register("metrale", MG_FP8_QUANTIZE_KERNEL_TENSOR_AMAX, kernel_tensor_amax);
    mg_cpu_kernel_register("metrale", MG_FP8_QUANTIZE_KERNEL_TENSOR_CODES, kernel_tensor_codes);
    mg_cpu_kernel_register("metrale", MG_FP8_QUANTIZE_KERNEL_TENSOR_FINISH, kernel_tensor_finish);
    mg_cpu_kernel_register("metrale", MG_FP8_QUANTIZE_KERNEL_ROWS, kernel_rows);
    mg_cpu_kernel_register("metrale", MG_FP8_QUANTIZE_KERNEL_1X128, kernel_1x128);
}

void mg_fp8_quantize_cpu_kernels_register(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, register_kernels);
}
