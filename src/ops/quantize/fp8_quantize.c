/* fp8_quantize.c - mg_fp8_quantize (metrale/ops_quantize.h): every argument checked once,
 * then the kernels of module "metrale" launched by name with the same arguments on every
 * backend (CUDA: kernels/cuda/fp8_quantize.cu; CPU: fp8_quantize_reference.c). */
#include <stdio.h>

#include "backend_impl.h"
#include "checked_math.h"
#include "error.h"
#include "metrale/launch.h"
#include "metrale/ops_gemm.h"
#include "metrale/ops_quantize.h"
#include "fp8_quantize_reference.h"
#include "op_cache.h"
#include "op_builtin.h"
#include "op_registry.h"

#define WHAT "mg_fp8_quantize"

/* The CUDA kernels' __launch_bounds__ and their per-thread work: blocks of at most this many
 * threads (a multiple of 32, so each 128-column block sits in one half-warp), each thread
 * keeping up to VECTORS_PER_THREAD 16-byte loads in flight. */
#define MAX_THREADS 128u
#define VECTORS_PER_THREAD 4u
#define BF16_PER_VECTOR 8u
/* Grid caps; every kernel is grid-stride. The per-tensor cap also bounds the atomics on the
 * one amax word to one per block. */
#define MAX_ROW_BLOCKS 65535u
#define MAX_TENSOR_BLOCKS 2048u

/* ------------------------------------------------------------------ sizes */

size_t mg_fp8_quant_scale_count(const mg_fp8_quant_desc *d) {
    if (!d)
        return 0;
    switch (d->mode) {
    case MG_FP8_QUANT_TENSOR:
        return 1;
    case MG_FP8_QUANT_ROW:
        return d->rows;
    case MG_FP8_QUANT_1X128:
        return (size_t)d->rows * mg_fp8_k_blocks(d->cols);
    case MG_FP8_QUANT_1X128_GEMM_LAYOUT:
        return (size_t)d->rows_pad * mg_fp8_k_blocks(d->cols);
    }
    return 0;
}

size_t mg_fp8_quant_output_bytes(const mg_fp8_quant_desc *d) {
    if (!d || (unsigned)d->mode > MG_FP8_QUANT_1X128_GEMM_LAYOUT)
        return 0;
    uint32_t rows = d->mode == MG_FP8_QUANT_1X128_GEMM_LAYOUT ? d->rows_pad : d->rows;
    return (size_t)rows * d->cols; /* < 2^64: both factors are 32-bit */
}

/* ------------------------------------------------------------------ argument checks */

static const char *mode_name(mg_fp8_quant_mode mode) {
    switch (mode) {
    case MG_FP8_QUANT_TENSOR:
        return "MG_FP8_QUANT_TENSOR";
    case MG_FP8_QUANT_ROW:
        return "MG_FP8_QUANT_ROW";
    case MG_FP8_QUANT_1X128:
        return "MG_FP8_QUANT_1X128";
    case MG_FP8_QUANT_1X128_GEMM_LAYOUT:
        return "MG_FP8_QUANT_1X128_GEMM_LAYOUT";
    }
    return "?";
}

/* The descriptor alone: mode, shape, pitch, padding. */
static mg_status check_desc(const mg_fp8_quant_desc *d) {
    if (!d)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, WHAT ": NULL descriptor");
    if ((unsigned)d->mode > MG_FP8_QUANT_1X128_GEMM_LAYOUT)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, WHAT ": unknown mode %d", (int)d->mode);
    if (d->rows == 0 || d->cols == 0)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, WHAT ": empty shape rows=%u cols=%u", d->rows,
                        d->cols);
    /* Rows are moved in 16-byte vectors (8 BF16 in, 8 codes out), with no edge cases. */
    if (d->cols % BF16_PER_VECTOR)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        WHAT ": cols=%u is not a multiple of 8 (rows are read in 16-byte vectors)",
                        d->cols);
    uint32_t pitch = d->in_pitch ? d->in_pitch : d->cols;
    if (pitch < d->cols || pitch % BF16_PER_VECTOR)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        WHAT ": in_pitch=%u must be >= cols=%u and a multiple of 8 (16-byte rows)",
                        pitch, d->cols);
    if (d->mode == MG_FP8_QUANT_1X128_GEMM_LAYOUT) {
        if (d->rows_pad < d->rows || d->rows_pad % 4)
            return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                            WHAT ": rows_pad=%u must be >= rows=%u and a multiple of 4 (least: %u)",
                            d->rows_pad, d->rows, mg_fp8_rows_padded(d->rows));
    } else if (d->rows_pad) {
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        WHAT ": rows_pad=%u is only for MG_FP8_QUANT_1X128_GEMM_LAYOUT, not %s; "
                             "leave it 0",
                        d->rows_pad, mode_name(d->mode));
    }
    return MG_OK;
}

static mg_status check_pointer(const char *name, mg_devptr p, uint32_t alignment) {
    if (!p)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, WHAT ": %s is null", name);
    if (p % alignment)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, WHAT ": %s 0x%llx is not %u-byte aligned", name,
                        (unsigned long long)p, alignment);
    return MG_OK;
}

typedef struct device_span {
    const char *name;
    mg_devptr start;
    size_t bytes;
} device_span;

static bool overlap(const device_span *a, const device_span *b) {
    return a->start < b->start + b->bytes && b->start < a->start + a->bytes;
}

/* Pointers, buffer ranges and overlaps, for a descriptor check_desc accepted. */
static mg_status check_buffers(mg_backend *b, const mg_fp8_quant_desc *d, mg_devptr in,
                               mg_devptr out, mg_devptr scales) {
    uint32_t scale_alignment = d->mode == MG_FP8_QUANT_TENSOR ? 4 : 16;
    mg_status st;
    if ((st = check_pointer("in", in, 16)) || (st = check_pointer("out", out, 16)) ||
        (st = check_pointer("scales", scales, scale_alignment)))
        return st;
    uint32_t pitch = d->in_pitch ? d->in_pitch : d->cols;
    device_span spans[3] = {
        {"in", in, 0}, {"out", out, mg_fp8_quant_output_bytes(d)}, {"scales", scales, 0}};
    if (!mg_matrix_span_bytes(d->rows, d->cols, pitch, 2, &spans[0].bytes) ||
        !mg_mul_size(mg_fp8_quant_scale_count(d), 4, &spans[2].bytes))
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        WHAT ": rows=%u cols=%u in_pitch=%u spans more bytes than the address "
                             "space",
                        d->rows, d->cols, pitch);
    for (int i = 0; i < 3; i++)
        if ((st = mg_backend_check_device_range(b, spans[i].start, spans[i].bytes, WHAT,
                                                spans[i].name)))
            return st;
    for (int i = 0; i < 3; i++)
        for (int j = i + 1; j < 3; j++)
            if (overlap(&spans[i], &spans[j]))
                return MG_ERROR(MG_ERR_INVALID_ARGUMENT, WHAT ": %s and %s overlap", spans[i].name,
                                spans[j].name);
    return MG_OK;
}

/* ------------------------------------------------------------------ launches */

typedef struct quant_launch {
    const char *kernel;
    mg_launch launch;
} quant_launch;

/* Threads for one block working on a row of `vectors` 16-byte vectors: enough for
 * VECTORS_PER_THREAD each, in whole warps, at most MAX_THREADS. */
static uint32_t row_threads(uint32_t vectors) {
    uint32_t want = (vectors + VECTORS_PER_THREAD - 1) / VECTORS_PER_THREAD;
    uint32_t warps = (want + 31) / 32;
    return warps * 32 < MAX_THREADS ? warps * 32 : MAX_THREADS;
}

static uint32_t min_u64(uint64_t a, uint32_t b) {
    return a < b ? (uint32_t)a : b;
}

static void add_shape_args(mg_launch *l, const mg_fp8_quant_desc *d) {
    mg_launch_arg_u32(l, d->rows);
    mg_launch_arg_u32(l, d->cols);
    mg_launch_arg_u32(l, d->in_pitch ? d->in_pitch : d->cols);
}

/* Builds the launches of `d`'s mode, in order; returns how many. */
static int build_launches(const mg_fp8_quant_desc *d, mg_devptr in, mg_devptr out, mg_devptr scales,
                          quant_launch launches[4]) {
    uint32_t vectors = d->cols / BF16_PER_VECTOR;
    mg_dim3 one = {1, 1, 1};
    switch (d->mode) {
    case MG_FP8_QUANT_TENSOR: {
        uint32_t chunk = MAX_THREADS * VECTORS_PER_THREAD;
        uint64_t units = (uint64_t)d->rows * ((vectors + chunk - 1) / chunk);
        mg_dim3 grid = {min_u64(units, MAX_TENSOR_BLOCKS), 1, 1}, block = {MAX_THREADS, 1, 1};
        launches[0].kernel = MG_FP8_QUANTIZE_KERNEL_TENSOR_RESET;
        mg_launch_init(&launches[0].launch, one, one, 0);
        mg_launch_arg_ptr(&launches[0].launch, scales);
        launches[1].kernel = MG_FP8_QUANTIZE_KERNEL_TENSOR_AMAX;
        mg_launch_init(&launches[1].launch, grid, block, 0);
        mg_launch_arg_ptr(&launches[1].launch, in);
        mg_launch_arg_ptr(&launches[1].launch, scales);
        add_shape_args(&launches[1].launch, d);
        launches[2].kernel = MG_FP8_QUANTIZE_KERNEL_TENSOR_CODES;
        mg_launch_init(&launches[2].launch, grid, block, 0);
        mg_launch_arg_ptr(&launches[2].launch, in);
        mg_launch_arg_ptr(&launches[2].launch, out);
        mg_launch_arg_ptr(&launches[2].launch, scales);
        add_shape_args(&launches[2].launch, d);
        launches[3].kernel = MG_FP8_QUANTIZE_KERNEL_TENSOR_FINISH;
        mg_launch_init(&launches[3].launch, one, one, 0);
        mg_launch_arg_ptr(&launches[3].launch, scales);
        return 4;
    }
    case MG_FP8_QUANT_ROW: {
        mg_dim3 grid = {min_u64(d->rows, MAX_ROW_BLOCKS), 1, 1};
        mg_dim3 block = {row_threads(vectors), 1, 1};
        launches[0].kernel = MG_FP8_QUANTIZE_KERNEL_ROWS;
        mg_launch_init(&launches[0].launch, grid, block, 0);
        mg_launch_arg_ptr(&launches[0].launch, in);
        mg_launch_arg_ptr(&launches[0].launch, out);
        mg_launch_arg_ptr(&launches[0].launch, scales);
        add_shape_args(&launches[0].launch, d);
        return 1;
    }
    case MG_FP8_QUANT_1X128:
    case MG_FP8_QUANT_1X128_GEMM_LAYOUT: {
        mg_fp8_quant_1x128_layout layout = mg_fp8_quant_1x128_layout_of(d);
        mg_dim3 grid = {min_u64(layout.rows_out, MAX_ROW_BLOCKS), 1, 1};
        mg_dim3 block = {row_threads(vectors), 1, 1};
        mg_launch *l = &launches[0].launch;
        launches[0].kernel = MG_FP8_QUANTIZE_KERNEL_1X128;
        mg_launch_init(l, grid, block, 0);
        mg_launch_arg_ptr(l, in);
        mg_launch_arg_ptr(l, out);
        mg_launch_arg_ptr(l, scales);
        mg_launch_arg_u32(l, d->rows);
        mg_launch_arg_u32(l, layout.rows_out);
        mg_launch_arg_u32(l, d->cols);
        mg_launch_arg_u32(l, d->in_pitch ? d->in_pitch : d->cols);
        mg_launch_arg_u32(l, layout.row_stride);
        mg_launch_arg_u32(l, layout.block_stride);
        return 1;
    }
    }
    return 0;
}

/* Our kernels run on every backend that ships them under their names (the CUDA backend's
 * embedded fatbins, the CPU backend's registered reference kernels). */
static bool kernels_available(mg_backend *b, char *reason, size_t reason_bytes) {
    return mg_op_builtin_available(b, MG_FP8_QUANTIZE_KERNEL_ROWS, mg_fp8_quantize_cpu_kernels_register, reason, reason_bytes);
}

static const mg_op_provider kernels_provider = {
    .name = "kernels", .backend = MG_OP_ANY_BACKEND, .available = kernels_available};

static const mg_op_provider *const quantize_providers[] = {&kernels_provider, NULL};

const mg_op_def mg_fp8_quantize_op = {MG_OP_FP8_QUANTIZE, "fp8_quantize", quantize_providers};

mg_status mg_fp8_quantize(mg_backend *b, mg_stream *s, const mg_fp8_quant_desc *d, mg_devptr in,
                          mg_devptr out, mg_devptr scales) {
    if (!mg_backend_is_live(b))
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, WHAT ": NULL, invalid or closed backend %p",
                        (void *)b);
    mg_status st = check_desc(d);
    if (st || (st = check_buffers(b, d, in, out, scales)))
        return st;
    const mg_op_provider *provider;
    if ((st = mg_op_choose(b, MG_OP_FP8_QUANTIZE, d, WHAT, &provider)))
        return st;
    mg_op_cache *cache = mg_backend_op_cache(b);
    if (!cache)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, WHAT ": invalid or closed backend");
    mg_fp8_quantize_cpu_kernels_register();
    quant_launch launches[4];
    int count = build_launches(d, in, out, scales, launches);
    /* Every kernel is resolved before the first launch, so a missing one writes nothing. */
    mg_kernel *kernels[4];
    for (int i = 0; i < count; i++)
        if ((st = mg_op_cache_kernel(cache, "metrale", launches[i].kernel, false, &kernels[i])))
            return st;
    for (int i = 0; i < count; i++)
        if ((st = mg_launch_run(b, kernels[i], s, &launches[i].launch)))
            return st;
    mg_op_count_call(b, MG_OP_FP8_QUANTIZE, provider, false);
    return MG_OK;
}
