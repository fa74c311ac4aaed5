/* nvfp4_format.c - the NVFP4 format tools of metrale/nvfp4.h: size and host helpers, and the
 * device tools' fronts (every argument checked, then the kernels of module "metrale" launched by
 * name with the same arguments on every backend: CUDA kernels/cuda/nvfp4/nvfp4_format.cu, CPU
 * nvfp4_format_reference.c). */
#include <math.h>
#include <string.h>

#include "backend_impl.h"
#include "error.h"
#include "metrale/launch.h"
#include "metrale/nvfp4.h"
#include "metrale/ops.h"
#include "nvfp4_format_reference.h"
#include "op_builtin.h"

/* Grid cap; every kernel is grid-stride. */
#define MAX_BLOCKS 16384u

/* ------------------------------------------------------------------ sizes */

static size_t round_up(size_t v, size_t m) {
    return (v + m - 1) / m * m;
}

/* rows * cols, 0 on overflow (a 64-bit size_t never overflows two 32-bit factors). */
static size_t product(size_t rows, size_t cols) {
    return cols && rows > SIZE_MAX / cols ? 0 : rows * cols;
}

size_t mg_nvfp4_packed_bytes(uint32_t n, uint32_t k) {
    return k % MG_NVFP4_BLOCK ? 0 : product(n, k / 2);
}

size_t mg_nvfp4_scale_bytes(uint32_t n, uint32_t k) {
    return k % MG_NVFP4_BLOCK ? 0 : product(n, k / MG_NVFP4_BLOCK);
}

size_t mg_nvfp4_swizzled_scale_bytes(uint32_t n, uint32_t k) {
    if (k % MG_NVFP4_BLOCK)
        return 0;
    return product(round_up(n, MG_NVFP4_SF_TILE_ROWS),
                   round_up(k / MG_NVFP4_BLOCK, MG_NVFP4_SF_TILE_COLS));
}

size_t mg_nvfp4_swizzled_offset(uint32_t row, uint32_t col, uint32_t cols) {
    size_t col_tiles = round_up(cols, MG_NVFP4_SF_TILE_COLS) / MG_NVFP4_SF_TILE_COLS;
    size_t tile = (size_t)(row / MG_NVFP4_SF_TILE_ROWS) * col_tiles + col / MG_NVFP4_SF_TILE_COLS;
    return tile * MG_NVFP4_SF_TILE_ROWS * MG_NVFP4_SF_TILE_COLS + (row % 32u) * 16u +
           ((row % MG_NVFP4_SF_TILE_ROWS) / 32u) * 4u + col % MG_NVFP4_SF_TILE_COLS;
}

/* ------------------------------------------------------------------ host helpers */

float mg_nvfp4_e2m1_to_f32(uint8_t nibble) {
    static const float magnitude[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    float m = magnitude[nibble & 7u];
    return (nibble & 8u) ? -m : m;
}

float mg_nvfp4_global_scale_from_amax(float amax) {
    if (!(amax > 0.0f) || !isfinite(amax))
        return 1.0f;
    return amax / (MG_FP8_E4M3_MAX * MG_NVFP4_E2M1_MAX);
}

float mg_nvfp4_global_scale(const uint16_t *x, uint32_t n, uint32_t k, uint32_t pitch) {
    if (!x)
        return 1.0f;
    if (!pitch)
        pitch = k;
    float amax = 0.0f;
    for (uint32_t r = 0; r < n; r++)
        for (uint32_t c = 0; c < k; c++) {
            float a = fabsf(mg_bf16_to_f32(x[(size_t)r * pitch + c]));
            if (isfinite(a) && a > amax)
                amax = a;
        }
    return mg_nvfp4_global_scale_from_amax(amax);
}

/* ------------------------------------------------------------------ argument checks */

static mg_status check_shape(mg_backend *b, const char *fn, uint32_t n, uint32_t k) {
    mg_status st = mg_op_enter(b, fn);
    if (st)
        return st;
    if (n == 0 || k == 0)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: empty shape n=%u k=%u", fn, n, k);
    if (k % MG_NVFP4_BLOCK)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "%s: k=%u is not a multiple of 16 (one E4M3 scale per 16 elements)", fn, k);
    return MG_OK;
}

/* ------------------------------------------------------------------ launches */

static const mg_op_provider kernels_provider =
    MG_OP_KERNELS_PROVIDER(mg_nvfp4_format_cpu_kernels_register, MG_NVFP4_KERNEL_QUANTIZE);

static const mg_op_provider *const format_providers[] = {&kernels_provider, NULL};

const mg_op_def mg_nvfp4_format_op = {MG_OP_NVFP4_FORMAT, "nvfp4_format", format_providers};

/* One grid-stride launch over `items` work items (threads), MG_NVFP4_THREADS per block. */
static void launch_init(mg_launch *l, uint64_t items) {
    uint64_t blocks = (items + MG_NVFP4_THREADS - 1) / MG_NVFP4_THREADS;
    mg_dim3 grid = {blocks < MAX_BLOCKS ? (uint32_t)blocks : MAX_BLOCKS, 1, 1};
    mg_dim3 block = {MG_NVFP4_THREADS, 1, 1};
    mg_launch_init(l, grid, block, 0);
}

static mg_status run_kernels(mg_backend *b, mg_stream *s, const char *fn, const char *const *names,
                             mg_launch *launches, int count) {
    return mg_op_run_builtin(b, s, MG_OP_NVFP4_FORMAT, fn, names, launches, count);
}

/* ------------------------------------------------------------------ device tools */

mg_status mg_nvfp4_quantize(mg_backend *b, mg_stream *s, uint32_t n, uint32_t k, uint32_t in_pitch,
                            mg_devptr in, mg_devptr global, mg_devptr packed, mg_devptr scales) {
    static const char fn[] = "mg_nvfp4_quantize";
    mg_status st = check_shape(b, fn, n, k);
    if (st)
        return st;
    uint32_t pitch = in_pitch ? in_pitch : k;
    if (pitch < k || pitch % 8)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "%s: in_pitch=%u must be >= k=%u and a multiple of 8 (16-byte rows)", fn,
                        pitch, k);
    mg_op_tensor t[] = {
        {"in", in, product((uint64_t)(n - 1) * pitch + k, 2), 16, MG_OP_IN},
        {"global", global, 4, 4, MG_OP_IN},
        {"packed", packed, mg_nvfp4_packed_bytes(n, k), 8, MG_OP_OUT},
        {"scales", scales, mg_nvfp4_scale_bytes(n, k), 1, MG_OP_OUT},
    };
    if ((st = mg_op_check_tensors(b, fn, t, 4, -1, -1)))
        return st;
    mg_launch l;
    launch_init(&l, (uint64_t)n * (k / MG_NVFP4_BLOCK));
    mg_launch_arg_ptr(&l, in);
    mg_launch_arg_ptr(&l, global);
    mg_launch_arg_ptr(&l, packed);
    mg_launch_arg_ptr(&l, scales);
    mg_launch_arg_u32(&l, n);
    mg_launch_arg_u32(&l, k);
    mg_launch_arg_u32(&l, pitch);
    const char *name = MG_NVFP4_KERNEL_QUANTIZE;
    return run_kernels(b, s, fn, &name, &l, 1);
}

mg_status mg_nvfp4_dequantize(mg_backend *b, mg_stream *s, uint32_t n, uint32_t k, mg_devptr packed,
                              mg_devptr scales, mg_devptr global, mg_dtype out_dtype,
                              mg_devptr out) {
    static const char fn[] = "mg_nvfp4_dequantize";
    mg_status st = check_shape(b, fn, n, k);
    if (st)
        return st;
    if (out_dtype != MG_DTYPE_BF16 && out_dtype != MG_DTYPE_F32)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: out_dtype %s is neither BF16 nor F32", fn,
                        mg_dtype_name(out_dtype));
    mg_op_tensor t[] = {
        {"packed", packed, mg_nvfp4_packed_bytes(n, k), 8, MG_OP_IN},
        {"scales", scales, mg_nvfp4_scale_bytes(n, k), 1, MG_OP_IN},
        {"global", global, 4, 4, MG_OP_IN},
        {"out", out, product(n, (size_t)k * mg_dtype_bytes(out_dtype)), 16, MG_OP_OUT},
    };
    if ((st = mg_op_check_tensors(b, fn, t, 4, -1, -1)))
        return st;
    mg_launch l;
    launch_init(&l, (uint64_t)n * (k / MG_NVFP4_BLOCK));
    mg_launch_arg_ptr(&l, packed);
    mg_launch_arg_ptr(&l, scales);
    mg_launch_arg_ptr(&l, global);
    mg_launch_arg_ptr(&l, out);
    mg_launch_arg_u32(&l, n);
    mg_launch_arg_u32(&l, k);
    const char *name = out_dtype == MG_DTYPE_F32 ? MG_NVFP4_KERNEL_DEQUANTIZE_F32
                                                 : MG_NVFP4_KERNEL_DEQUANTIZE_BF16;
    return run_kernels(b, s, fn, &name, &l, 1);
}

mg_status mg_nvfp4_transpose(mg_backend *b, mg_stream *s, mg_nvfp4_transpose_dir dir, uint32_t n,
                             uint32_t k, mg_devptr packed_in, mg_devptr scales_in,
                             mg_devptr packed_out, mg_devptr scales_out) {
    static const char fn[] = "mg_nvfp4_transpose";
    mg_status st = check_shape(b, fn, n, k);
    if (st)
        return st;
    if ((unsigned)dir > MG_NVFP4_NK_TO_KN)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: unknown direction %d", fn, (int)dir);
    if (n % 2)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "%s: n=%u is odd (the [K, N] layout packs two N elements per byte)", fn, n);
    size_t packed_bytes = mg_nvfp4_packed_bytes(n, k), scale_bytes = mg_nvfp4_scale_bytes(n, k);
    mg_op_tensor t[] = {
        {"packed_in", packed_in, packed_bytes, 1, MG_OP_IN},
        {"scales_in", scales_in, scale_bytes, 1, MG_OP_IN},
        {"packed_out", packed_out, packed_bytes, 1, MG_OP_OUT},
        {"scales_out", scales_out, scale_bytes, 1, MG_OP_OUT},
    };
    if ((st = mg_op_check_tensors(b, fn, t, 4, -1, -1)))
        return st;
    /* The input's rows and columns, as the kernels see them. */
    bool from_kn = dir == MG_NVFP4_KN_TO_NK;
    uint32_t rows = from_kn ? k : n, cols = from_kn ? n : k;
    uint32_t scale_rows = from_kn ? k / MG_NVFP4_BLOCK : n;
    uint32_t scale_cols = from_kn ? n : k / MG_NVFP4_BLOCK;
    mg_launch l[2];
    launch_init(&l[0], (uint64_t)rows * cols / 2);
    mg_launch_arg_ptr(&l[0], packed_in);
    mg_launch_arg_ptr(&l[0], packed_out);
    mg_launch_arg_u32(&l[0], rows);
    mg_launch_arg_u32(&l[0], cols);
    launch_init(&l[1], (uint64_t)scale_rows * scale_cols);
    mg_launch_arg_ptr(&l[1], scales_in);
    mg_launch_arg_ptr(&l[1], scales_out);
    mg_launch_arg_u32(&l[1], scale_rows);
    mg_launch_arg_u32(&l[1], scale_cols);
    const char *names[2] = {MG_NVFP4_KERNEL_TRANSPOSE_NIBBLES, MG_NVFP4_KERNEL_TRANSPOSE_BYTES};
    return run_kernels(b, s, fn, names, l, 2);
}

static mg_status swizzle(mg_backend *b, mg_stream *s, const char *fn, bool forward, uint32_t n,
                         uint32_t k, mg_devptr in, mg_devptr out) {
    mg_status st = check_shape(b, fn, n, k);
    if (st)
        return st;
    size_t plain = mg_nvfp4_scale_bytes(n, k), swizzled = mg_nvfp4_swizzled_scale_bytes(n, k);
    mg_op_tensor t[] = {
        {forward ? "scales" : "swizzled", in, forward ? plain : swizzled, forward ? 1 : 16,
         MG_OP_IN},
        {forward ? "swizzled" : "scales", out, forward ? swizzled : plain, forward ? 16 : 1,
         MG_OP_OUT},
    };
    if ((st = mg_op_check_tensors(b, fn, t, 2, -1, -1)))
        return st;
    mg_launch l;
    launch_init(&l, forward ? swizzled : plain);
    mg_launch_arg_ptr(&l, in);
    mg_launch_arg_ptr(&l, out);
    mg_launch_arg_u32(&l, n);
    mg_launch_arg_u32(&l, k / MG_NVFP4_BLOCK);
    const char *name = forward ? MG_NVFP4_KERNEL_SWIZZLE : MG_NVFP4_KERNEL_UNSWIZZLE;
    return run_kernels(b, s, fn, &name, &l, 1);
}

mg_status mg_nvfp4_scales_swizzle(mg_backend *b, mg_stream *s, uint32_t n, uint32_t k,
                                  mg_devptr scales, mg_devptr swizzled) {
    return swizzle(b, s, "mg_nvfp4_scales_swizzle", true, n, k, scales, swizzled);
}

mg_status mg_nvfp4_scales_unswizzle(mg_backend *b, mg_stream *s, uint32_t n, uint32_t k,
                                    mg_devptr swizzled, mg_devptr scales) {
    return swizzle(b, s, "mg_nvfp4_scales_unswizzle", false, n, k, swizzled, scales);
}
