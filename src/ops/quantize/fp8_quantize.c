/* fp8_quantize.c - mg_fp8_quantize (metrale/ops_quantize.h): every argument checked once,
 * then the kernels of module "metrale" launched by name with the same arguments on every
 * backend (CUDA: kernels/cuda/quantize/fp8_quantize.cu; CPU: fp8_quantize_reference.c). */
#include "backend_impl.h"
#include "checked_math.h"
#include "error.h"
#include "fp8_quantize_reference.h"
#include "metrale/launch.h"
#include "metrale/ops_gemm.h"
#include "metrale/ops_quantize.h"
#include "op_builtin.h"

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

/* Pointers, buffer ranges and overlaps, for a descriptor check_desc accepted. */
static mg_status check_buffers(mg_backend *b, const mg_fp8_quant_desc *d, mg_devptr in,
                               mg_devptr out, mg_devptr scales) {
    uint32_t pitch = d->in_pitch ? d->in_pitch : d->cols;
    size_t scale_bytes = 0;
    mg_mul_size(mg_fp8_quant_scale_count(d), 4, &scale_bytes); /* 0 on overflow: refused */
    mg_op_tensor t[] = {
        {"in", in, mg_op_matrix_bytes(d->rows, d->cols, pitch, 2), 16, MG_OP_IN},
        {"out", out, mg_fp8_quant_output_bytes(d), 16, MG_OP_OUT},
        {"scales", scales, scale_bytes, d->mode == MG_FP8_QUANT_TENSOR ? 4 : 16, MG_OP_OUT},
    };
    return mg_op_check_tensors(b, WHAT, t, 3, -1, -1);
}

/* ------------------------------------------------------------------ launches */

/* The kernels of one call, in launch order. */
typedef struct quant_launches {
    const char *kernel[4];
    mg_launch launch[4];
} quant_launches;

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
                          quant_launches *q) {
    uint32_t vectors = d->cols / BF16_PER_VECTOR;
    mg_dim3 one = {1, 1, 1};
    switch (d->mode) {
    case MG_FP8_QUANT_TENSOR: {
        uint32_t chunk = MAX_THREADS * VECTORS_PER_THREAD;
        uint64_t units = (uint64_t)d->rows * ((vectors + chunk - 1) / chunk);
        mg_dim3 grid = {min_u64(units, MAX_TENSOR_BLOCKS), 1, 1}, block = {MAX_THREADS, 1, 1};
        q->kernel[0] = MG_FP8_QUANTIZE_KERNEL_TENSOR_RESET;
        mg_launch_init(&q->launch[0], one, one, 0);
        mg_launch_arg_ptr(&q->launch[0], scales);
        q->kernel[1] = MG_FP8_QUANTIZE_KERNEL_TENSOR_AMAX;
        mg_launch_init(&q->launch[1], grid, block, 0);
        mg_launch_arg_ptr(&q->launch[1], in);
        mg_launch_arg_ptr(&q->launch[1], scales);
        add_shape_args(&q->launch[1], d);
        q->kernel[2] = MG_FP8_QUANTIZE_KERNEL_TENSOR_CODES;
        mg_launch_init(&q->launch[2], grid, block, 0);
        mg_launch_arg_ptr(&q->launch[2], in);
        mg_launch_arg_ptr(&q->launch[2], out);
        mg_launch_arg_ptr(&q->launch[2], scales);
        add_shape_args(&q->launch[2], d);
        q->kernel[3] = MG_FP8_QUANTIZE_KERNEL_TENSOR_FINISH;
        mg_launch_init(&q->launch[3], one, one, 0);
        mg_launch_arg_ptr(&q->launch[3], scales);
        return 4;
    }
    case MG_FP8_QUANT_ROW: {
        mg_dim3 grid = {min_u64(d->rows, MAX_ROW_BLOCKS), 1, 1};
        mg_dim3 block = {row_threads(vectors), 1, 1};
        q->kernel[0] = MG_FP8_QUANTIZE_KERNEL_ROWS;
        mg_launch_init(&q->launch[0], grid, block, 0);
        mg_launch_arg_ptr(&q->launch[0], in);
        mg_launch_arg_ptr(&q->launch[0], out);
        mg_launch_arg_ptr(&q->launch[0], scales);
        add_shape_args(&q->launch[0], d);
        return 1;
    }
    case MG_FP8_QUANT_1X128:
    case MG_FP8_QUANT_1X128_GEMM_LAYOUT: {
        mg_fp8_quant_1x128_layout layout = mg_fp8_quant_1x128_layout_of(d);
        mg_dim3 grid = {min_u64(layout.rows_out, MAX_ROW_BLOCKS), 1, 1};
        mg_dim3 block = {row_threads(vectors), 1, 1};
        mg_launch *l = &q->launch[0];
        q->kernel[0] = MG_FP8_QUANTIZE_KERNEL_1X128;
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
static const mg_op_provider kernels_provider =
    MG_OP_KERNELS_PROVIDER(mg_fp8_quantize_cpu_kernels_register, MG_FP8_QUANTIZE_KERNEL_ROWS);

static const mg_op_provider *const quantize_providers[] = {&kernels_provider, NULL};

const mg_op_def mg_fp8_quantize_op = {MG_OP_FP8_QUANTIZE, "fp8_quantize", quantize_providers};

mg_status mg_fp8_quantize(mg_backend *b, mg_stream *s, const mg_fp8_quant_desc *d, mg_devptr in,
                          mg_devptr out, mg_devptr scales) {
    mg_status st = mg_op_enter(b, WHAT);
    if (st || (st = check_desc(d)) || (st = check_buffers(b, d, in, out, scales)))
        return st;
    quant_launches q;
    int count = build_launches(d, in, out, scales, &q);
    return mg_op_run_builtin(b, s, MG_OP_FP8_QUANTIZE, WHAT, q.kernel, q.launch, count);
}
