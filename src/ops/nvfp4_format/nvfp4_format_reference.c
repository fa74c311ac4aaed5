/* nvfp4_format_reference.c - the CPU reference of the NVFP4 format tools
 * (nvfp4_format_reference.h): the tools on host memory, and the CPU kernels that run them under
 * the CUDA kernels' names and argument lists. */
#include "nvfp4_format_reference.h"

#include <math.h>
#include <pthread.h>
#include <string.h>

#include "cpu_kernels.h"
#include "error.h"
#include "metrale/dtype.h"
#include "metrale/launch.h"
#include "metrale/nvfp4.h"

/* ------------------------------------------------------------------ the rule */

/* The block scale code of a block whose finite amax is `amax` (metrale/nvfp4.h). */
static uint8_t block_scale_code(float amax, float global) {
    float s = (amax / 6.0f) / global;
    /* a global of +0 would make s infinite (0x7e) and every divisor 0 (codes 6): not > 0 is a
     * zero weight, as metrale/nvfp4.h says */
    if (!(global > 0.0f) || !(s > 0.0f))
        return 0;
    return mg_f32_to_fp8_e4m3(s); /* round to nearest even, saturating at 448 (0x7e) */
}

/* The nibble of x for the block divisor d = e4m3(scale) * global (scale code not 0). */
static uint8_t e2m1_nibble(float x, float d) {
    float m = fabsf(x) / d;
    uint8_t code;
    if (!(m > 0.25f)) /* NaN included */
        return 0;
    if (m < 0.75f)
        code = 1;
    else if (m <= 1.25f)
        code = 2;
    else if (m < 1.75f)
        code = 3;
    else if (m <= 2.5f)
        code = 4;
    else if (m < 3.5f)
        code = 5;
    else if (m <= 5.0f)
        code = 6;
    else
        code = 7;
    return (uint8_t)(code | (signbit(x) ? 8u : 0u));
}

/* One dequantized value; NaN (from a NaN scale code) is the canonical quiet NaN, as on CUDA. */
static float dequantize_value(uint8_t nibble, uint8_t scale, float global) {
    float v = (mg_nvfp4_e2m1_to_f32(nibble) * mg_fp8_e4m3_to_f32(scale)) * global;
    return isnan(v) ? NAN : v;
}

void mg_nvfp4_quantize_reference(const uint16_t *in, float global, uint8_t *packed, uint8_t *scales,
                                 uint32_t n, uint32_t k, uint32_t pitch) {
    uint32_t blocks = k / MG_NVFP4_BLOCK;
    for (uint32_t r = 0; r < n; r++)
        for (uint32_t g = 0; g < blocks; g++) {
            const uint16_t *x = in + (size_t)r * pitch + (size_t)g * MG_NVFP4_BLOCK;
            float amax = 0.0f;
            for (uint32_t i = 0; i < MG_NVFP4_BLOCK; i++) {
                float a = fabsf(mg_bf16_to_f32(x[i]));
                if (isfinite(a) && a > amax)
                    amax = a;
            }
            uint8_t scale = block_scale_code(amax, global);
            scales[(size_t)r * blocks + g] = scale;
            float d = mg_fp8_e4m3_to_f32(scale) * global;
            uint8_t *out = packed + (size_t)r * (k / 2) + (size_t)g * (MG_NVFP4_BLOCK / 2);
            for (uint32_t i = 0; i < MG_NVFP4_BLOCK; i += 2) {
                uint8_t lo = scale ? e2m1_nibble(mg_bf16_to_f32(x[i]), d) : 0;
                uint8_t hi = scale ? e2m1_nibble(mg_bf16_to_f32(x[i + 1]), d) : 0;
                out[i / 2] = (uint8_t)(lo | hi << 4);
            }
        }
}

void mg_nvfp4_dequantize_reference(const uint8_t *packed, const uint8_t *scales, float global,
                                   float *f32_out, uint16_t *bf16_out, uint32_t n, uint32_t k) {
    uint32_t blocks = k / MG_NVFP4_BLOCK;
    for (uint32_t r = 0; r < n; r++)
        for (uint32_t c = 0; c < k; c++) {
            uint8_t byte = packed[(size_t)r * (k / 2) + c / 2];
            uint8_t nibble = (uint8_t)((c & 1) ? byte >> 4 : byte & 0xf);
            float v =
                dequantize_value(nibble, scales[(size_t)r * blocks + c / MG_NVFP4_BLOCK], global);
            if (f32_out)
                f32_out[(size_t)r * k + c] = v;
            else
                bf16_out[(size_t)r * k + c] = mg_f32_to_bf16(v);
        }
}

void mg_nvfp4_transpose_nibbles_reference(const uint8_t *in, uint8_t *out, uint32_t rows,
                                          uint32_t cols) {
    for (uint32_t c = 0; c < cols; c++)
        for (uint32_t r = 0; r < rows; r += 2) {
            const uint8_t *a = in + (size_t)r * (cols / 2) + c / 2;
            const uint8_t *b = a + cols / 2;
            unsigned shift = (c & 1) * 4;
            out[(size_t)c * (rows / 2) + r / 2] =
                (uint8_t)(((*a >> shift) & 0xf) | ((*b >> shift) & 0xf) << 4);
        }
}

void mg_nvfp4_transpose_bytes_reference(const uint8_t *in, uint8_t *out, uint32_t rows,
                                        uint32_t cols) {
    for (uint32_t r = 0; r < rows; r++)
        for (uint32_t c = 0; c < cols; c++)
            out[(size_t)c * rows + r] = in[(size_t)r * cols + c];
}

static size_t round_up(size_t v, size_t m) {
    return (v + m - 1) / m * m;
}

void mg_nvfp4_swizzle_reference(const uint8_t *in, uint8_t *out, uint32_t rows, uint32_t cols) {
    memset(out, 0, round_up(rows, MG_NVFP4_SF_TILE_ROWS) * round_up(cols, MG_NVFP4_SF_TILE_COLS));
    for (uint32_t r = 0; r < rows; r++)
        for (uint32_t c = 0; c < cols; c++)
            out[mg_nvfp4_swizzled_offset(r, c, cols)] = in[(size_t)r * cols + c];
}

void mg_nvfp4_unswizzle_reference(const uint8_t *in, uint8_t *out, uint32_t rows, uint32_t cols) {
    for (uint32_t r = 0; r < rows; r++)
        for (uint32_t c = 0; c < cols; c++)
            out[(size_t)r * cols + c] = in[mg_nvfp4_swizzled_offset(r, c, cols)];
}

/* ------------------------------------------------------------------ CPU kernels */

/* Every kernel checks its argument list and resolves each buffer with the bytes it touches and
 * the alignment the CUDA kernel's vector accesses need. Spans that overflow become UINT64_MAX,
 * which no buffer holds. */

static uint64_t span(uint64_t rows, uint64_t row_bytes) {
    return row_bytes && rows > UINT64_MAX / row_bytes ? UINT64_MAX : rows * row_bytes;
}

static mg_status check_k(const char *name, uint32_t k) {
    if (k == 0 || k % MG_NVFP4_BLOCK)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "cpu kernel %s: k=%u is not a positive multiple "
                        "of 16",
                        name, k);
    return MG_OK;
}

static mg_status kernel_quantize(const mg_launch *l) {
    static const char name[] = "metrale:" MG_NVFP4_KERNEL_QUANTIZE;
    static const mg_arg_kind kinds[] = {MG_ARG_BUFFER, MG_ARG_BUFFER, MG_ARG_BUFFER, MG_ARG_BUFFER,
                                        MG_ARG_U32,    MG_ARG_U32,    MG_ARG_U32};
    mg_status st = mg_cpu_kernel_check_args(l, name, kinds, 7);
    if (st)
        return st;
    uint32_t n = mg_launch_get_u32(l, 4), k = mg_launch_get_u32(l, 5);
    uint32_t pitch = mg_launch_get_u32(l, 6);
    if ((st = check_k(name, k)))
        return st;
    if (pitch < k)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "cpu kernel %s: in_pitch=%u < k=%u", name, pitch,
                        k);
    void *in, *global, *packed, *scales;
    uint64_t in_bytes = n ? ((uint64_t)(n - 1) * pitch + k) * 2 : 0;
    if ((st = mg_cpu_kernel_buffer(l, 0, in_bytes, 16, name, &in)) ||
        (st = mg_cpu_kernel_buffer(l, 1, 4, 4, name, &global)) ||
        (st = mg_cpu_kernel_buffer(l, 2, span(n, k / 2), 8, name, &packed)) ||
        (st = mg_cpu_kernel_buffer(l, 3, span(n, k / 16), 1, name, &scales)))
        return st;
    mg_nvfp4_quantize_reference(in, *(const float *)global, packed, scales, n, k, pitch);
    return MG_OK;
}

static mg_status dequantize(const mg_launch *l, const char *name, bool f32) {
    static const mg_arg_kind kinds[] = {MG_ARG_BUFFER, MG_ARG_BUFFER, MG_ARG_BUFFER,
                                        MG_ARG_BUFFER, MG_ARG_U32,    MG_ARG_U32};
    mg_status st = mg_cpu_kernel_check_args(l, name, kinds, 6);
    if (st)
        return st;
    uint32_t n = mg_launch_get_u32(l, 4), k = mg_launch_get_u32(l, 5);
    if ((st = check_k(name, k)))
        return st;
    void *packed, *scales, *global, *out;
    if ((st = mg_cpu_kernel_buffer(l, 0, span(n, k / 2), 8, name, &packed)) ||
        (st = mg_cpu_kernel_buffer(l, 1, span(n, k / 16), 1, name, &scales)) ||
        (st = mg_cpu_kernel_buffer(l, 2, 4, 4, name, &global)) ||
        (st = mg_cpu_kernel_buffer(l, 3, span(n, (uint64_t)k * (f32 ? 4 : 2)), 16, name, &out)))
        return st;
    mg_nvfp4_dequantize_reference(packed, scales, *(const float *)global, f32 ? out : NULL,
                                  f32 ? NULL : out, n, k);
    return MG_OK;
}

static mg_status kernel_dequantize_bf16(const mg_launch *l) {
    return dequantize(l, "metrale:" MG_NVFP4_KERNEL_DEQUANTIZE_BF16, false);
}

static mg_status kernel_dequantize_f32(const mg_launch *l) {
    return dequantize(l, "metrale:" MG_NVFP4_KERNEL_DEQUANTIZE_F32, true);
}

/* The (in, out, u32 rows, u32 cols) kernels: transposes and swizzles. */
typedef enum matrix_kernel { NIBBLES, BYTES, SWIZZLE, UNSWIZZLE } matrix_kernel;

static mg_status matrix(const mg_launch *l, const char *name, matrix_kernel which) {
    static const mg_arg_kind kinds[] = {MG_ARG_BUFFER, MG_ARG_BUFFER, MG_ARG_U32, MG_ARG_U32};
    mg_status st = mg_cpu_kernel_check_args(l, name, kinds, 4);
    if (st)
        return st;
    uint32_t rows = mg_launch_get_u32(l, 2), cols = mg_launch_get_u32(l, 3);
    if (which == NIBBLES && (rows % 2 || cols % 2))
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "cpu kernel %s: rows=%u and cols=%u must be even",
                        name, rows, cols);
    uint64_t plain = which == NIBBLES ? span(rows, cols / 2) : span(rows, cols);
    uint64_t swizzled =
        span(round_up(rows, MG_NVFP4_SF_TILE_ROWS), round_up(cols, MG_NVFP4_SF_TILE_COLS));
    uint64_t in_bytes = which == UNSWIZZLE ? swizzled : plain;
    uint64_t out_bytes = which == SWIZZLE ? swizzled : plain;
    void *in, *out;
    if ((st = mg_cpu_kernel_buffer(l, 0, in_bytes, which == UNSWIZZLE ? 16 : 1, name, &in)) ||
        (st = mg_cpu_kernel_buffer(l, 1, out_bytes, which == SWIZZLE ? 16 : 1, name, &out)))
        return st;
    switch (which) {
    case NIBBLES:
        mg_nvfp4_transpose_nibbles_reference(in, out, rows, cols);
        break;
    case BYTES:
        mg_nvfp4_transpose_bytes_reference(in, out, rows, cols);
        break;
    case SWIZZLE:
        mg_nvfp4_swizzle_reference(in, out, rows, cols);
        break;
    case UNSWIZZLE:
        mg_nvfp4_unswizzle_reference(in, out, rows, cols);
        break;
    }
    return MG_OK;
}

static mg_status kernel_transpose_nibbles(const mg_launch *l) {
    return matrix(l, "metrale:" MG_NVFP4_KERNEL_TRANSPOSE_NIBBLES, NIBBLES);
}

static mg_status kernel_transpose_bytes(const mg_launch *l) {
    return matrix(l, "metrale:" MG_NVFP4_KERNEL_TRANSPOSE_BYTES, BYTES);
}

static mg_status kernel_swizzle(const mg_launch *l) {
    return matrix(l, "metrale:" MG_NVFP4_KERNEL_SWIZZLE, SWIZZLE);
}

static mg_status kernel_unswizzle(const mg_launch *l) {
    return matrix(l, "metrale:" MG_NVFP4_KERNEL_UNSWIZZLE, UNSWIZZLE);
}

static void register_kernels(void) {
    /* Failure is out of host memory at start-up; the lookups then report NOT_FOUND. */
    mg_cpu_kernel_register("metrale", MG_NVFP4_KERNEL_QUANTIZE, kernel_quantize);
    mg_cpu_kernel_register("metrale", MG_NVFP4_KERNEL_DEQUANTIZE_BF16, kernel_dequantize_bf16);
    mg_cpu_kernel_register("metrale", MG_NVFP4_KERNEL_DEQUANTIZE_F32, kernel_dequantize_f32);
    mg_cpu_kernel_register("metrale", MG_NVFP4_KERNEL_TRANSPOSE_NIBBLES, kernel_transpose_nibbles);
    mg_cpu_kernel_register("metrale", MG_NVFP4_KERNEL_TRANSPOSE_BYTES, kernel_transpose_bytes);
    mg_cpu_kernel_register("metrale", MG_NVFP4_KERNEL_SWIZZLE, kernel_swizzle);
    mg_cpu_kernel_register("metrale", MG_NVFP4_KERNEL_UNSWIZZLE, kernel_unswizzle);
}

void mg_nvfp4_format_cpu_kernels_register(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, register_kernels);
}
