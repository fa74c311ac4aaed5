/* elementwise.c - mg_gather_rows_bf16, mg_rmsnorm_bf16, mg_argmax_f32, mg_argmax_bf16,
 * mg_fill_uniform_bf16 and mg_amax_bf16 (metrale/ops_elementwise.h): every argument checked
 * once, then the kernel of the same name (elementwise_reference.h) of module "metrale" launched
 * by name on any backend that ships it (CUDA: kernels/cuda/elementwise/elementwise.cu; CPU:
 * elementwise_reference.c). The three row ops share one provider, "kernels"; the two
 * synthetic-data ops have one each. */
#include <math.h>
#include <stdint.h>

#include "backend_impl.h"
#include "checked_math.h"
#include "elementwise_reference.h"
#include "error.h"
#include "metrale/launch.h"
#include "metrale/ops_elementwise.h"
#include "op_builtin.h"

/* Threads per block: one block per row for all three kernels; the argmax reads rows of a
 * vocabulary's logits with one block each, so it takes the most threads a block may have. */
#define ROW_THREADS 256u
#define ARGMAX_THREADS 1024u

static const mg_op_provider kernels_provider =
    MG_OP_KERNELS_PROVIDER(mg_elementwise_cpu_kernels_register, MG_GATHER_ROWS_KERNEL,
                           MG_RMSNORM_KERNEL, MG_ARGMAX_KERNEL, MG_ARGMAX_BF16_KERNEL);

static const mg_op_provider *const elementwise_providers[] = {&kernels_provider, NULL};

const mg_op_def mg_gather_rows_op = {MG_OP_GATHER_ROWS, "gather_rows", elementwise_providers};
const mg_op_def mg_rmsnorm_op = {MG_OP_RMSNORM, "rmsnorm", elementwise_providers};
const mg_op_def mg_argmax_op = {MG_OP_ARGMAX, "argmax", elementwise_providers};

/* The synthetic-data helpers are ops of their own (a backend may ship them without the rows
 * ops, and mg_op_supported tells a caller whether to generate on the host instead). */
static const mg_op_provider fill_provider =
    MG_OP_KERNELS_PROVIDER(mg_elementwise_cpu_kernels_register, MG_FILL_UNIFORM_KERNEL);
static const mg_op_provider amax_provider =
    MG_OP_KERNELS_PROVIDER(mg_elementwise_cpu_kernels_register, MG_AMAX_KERNEL);
static const mg_op_provider *const fill_providers[] = {&fill_provider, NULL};
static const mg_op_provider *const amax_providers[] = {&amax_provider, NULL};
const mg_op_def mg_fill_uniform_op = {MG_OP_FILL_UNIFORM, "fill_uniform", fill_providers};
const mg_op_def mg_amax_op = {MG_OP_AMAX, "amax", amax_providers};

/* Grid of the two: blocks of FILL_THREADS threads, each thread 8 elements per pass, at most
 * MAX_BLOCKS blocks (grid-stride beyond). */
#define FILL_THREADS 256u
#define MAX_BLOCKS 4096u

/* BF16 packed rows: cols a multiple of 8, the matrix within size_t. */
static mg_status check_bf16_shape(const char *fn, uint32_t rows, uint32_t cols, size_t *bytes) {
    if (!rows || !cols)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: empty shape rows=%u cols=%u", fn, rows, cols);
    if (cols % 8)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "%s: cols=%u is not a multiple of 8 (16-byte rows)", fn, cols);
    size_t span;
    if (!mg_matrix_span_bytes(rows, cols, cols, 2, &span))
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: %u x %u spans more than the address space",
                        fn, rows, cols);
    *bytes = span;
    return MG_OK;
}

static mg_status launch(mg_backend *b, mg_stream *s, mg_op op, const char *fn, const char *kernel,
                        mg_launch *l) {
    return mg_op_run_builtin(b, s, op, fn, &kernel, l, 1);
}

mg_status mg_gather_rows_bf16(mg_backend *b, mg_stream *s, uint32_t rows, uint32_t cols,
                              mg_devptr ids, uint32_t src_rows, mg_devptr src, mg_devptr add,
                              mg_devptr out) {
    static const char fn[] = "mg_gather_rows_bf16";
    size_t out_bytes, src_bytes;
    mg_status st = mg_op_enter(b, fn);
    if (st || (st = check_bf16_shape(fn, rows, cols, &out_bytes)))
        return st;
    if (!src_rows)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: src_rows is 0", fn);
    if ((st = check_bf16_shape(fn, src_rows, cols, &src_bytes)))
        return st;
    mg_op_tensor t[] = {
        {"ids", ids, (size_t)rows * 4, 4, MG_OP_IN},
        {"src", src, src_bytes, 16, MG_OP_IN},
        {"add", add, src_bytes, 16, MG_OP_IN | MG_OP_OPTIONAL},
        {"out", out, out_bytes, 16, MG_OP_OUT},
    };
    if ((st = mg_op_check_tensors(b, fn, t, 4, -1, -1)))
        return st;
    mg_launch l;
    mg_launch_init(&l, (mg_dim3){rows, 1, 1}, (mg_dim3){ROW_THREADS, 1, 1}, 0);
    mg_launch_arg_ptr(&l, ids);
    mg_launch_arg_ptr(&l, src);
    mg_launch_arg_ptr(&l, add);
    mg_launch_arg_ptr(&l, out);
    mg_launch_arg_u32(&l, rows);
    mg_launch_arg_u32(&l, cols);
    mg_launch_arg_u32(&l, src_rows);
    return launch(b, s, MG_OP_GATHER_ROWS, fn, MG_GATHER_ROWS_KERNEL, &l);
}

mg_status mg_rmsnorm_bf16(mg_backend *b, mg_stream *s, uint32_t rows, uint32_t cols, float eps,
                          mg_devptr x, mg_devptr add, mg_devptr weight, mg_devptr out) {
    static const char fn[] = "mg_rmsnorm_bf16";
    size_t bytes;
    mg_status st = mg_op_enter(b, fn);
    if (st || (st = check_bf16_shape(fn, rows, cols, &bytes)))
        return st;
    if (!isfinite(eps) || eps < 0)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: eps=%g must be finite and >= 0", fn,
                        (double)eps);
    /* out may be x itself (in place); x is then read before it is written, row by row. With
     * an add, x receives the sum, so it must not also be the output. */
    mg_op_tensor t[] = {
        {"x", x, bytes, 16, add ? MG_OP_OUT : MG_OP_IN},
        {"add", add, bytes, 16, MG_OP_IN | MG_OP_OPTIONAL},
        {"weight", weight, (size_t)cols * 2, 16, MG_OP_IN},
        {"out", out, bytes, 16, MG_OP_OUT},
    };
    if ((st = mg_op_check_tensors(b, fn, t, 4, add ? -1 : 0, add ? -1 : 3)))
        return st;
    if (mg_op_ranges_overlap(weight, (size_t)cols * 2, x, bytes))
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: x and weight overlap", fn);
    mg_launch l;
    mg_launch_init(&l, (mg_dim3){rows, 1, 1}, (mg_dim3){ROW_THREADS, 1, 1}, 0);
    mg_launch_arg_ptr(&l, x);
    mg_launch_arg_ptr(&l, add);
    mg_launch_arg_ptr(&l, weight);
    mg_launch_arg_ptr(&l, out);
    mg_launch_arg_u32(&l, rows);
    mg_launch_arg_u32(&l, cols);
    mg_launch_arg_f32(&l, eps);
    return launch(b, s, MG_OP_RMSNORM, fn, MG_RMSNORM_KERNEL, &l);
}

/* argmax over FP32 (element_bytes 4) or BF16 (2) rows: rows 16-byte aligned. */
static mg_status argmax(mg_backend *b, mg_stream *s, const char *fn, const char *kernel,
                        unsigned element_bytes, uint32_t rows, uint32_t cols, mg_devptr in,
                        uint32_t pitch, mg_devptr ids) {
    mg_status st = mg_op_enter(b, fn);
    if (st)
        return st;
    if (!rows || !cols)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: empty shape rows=%u cols=%u", fn, rows, cols);
    unsigned per_vector = 16 / element_bytes;
    if (pitch < cols || pitch % per_vector)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "%s: pitch=%u must be >= cols=%u and a multiple of %u", fn, pitch, cols,
                        per_vector);
    mg_op_tensor t[] = {
        {"in", in, mg_op_matrix_bytes(rows, cols, pitch, element_bytes), 16, MG_OP_IN},
        {"ids", ids, (size_t)rows * 4, 4, MG_OP_OUT},
    };
    if ((st = mg_op_check_tensors(b, fn, t, 2, -1, -1)))
        return st;
    mg_launch l;
    mg_launch_init(&l, (mg_dim3){rows, 1, 1}, (mg_dim3){ARGMAX_THREADS, 1, 1}, 0);
    mg_launch_arg_ptr(&l, in);
    mg_launch_arg_ptr(&l, ids);
    mg_launch_arg_u32(&l, rows);
    mg_launch_arg_u32(&l, cols);
    mg_launch_arg_u32(&l, pitch);
    return launch(b, s, MG_OP_ARGMAX, fn, kernel, &l);
}

mg_status mg_argmax_f32(mg_backend *b, mg_stream *s, uint32_t rows, uint32_t cols, mg_devptr in,
                        uint32_t pitch, mg_devptr ids) {
    return argmax(b, s, "mg_argmax_f32", MG_ARGMAX_KERNEL, 4, rows, cols, in, pitch, ids);
}

mg_status mg_argmax_bf16(mg_backend *b, mg_stream *s, uint32_t rows, uint32_t cols, mg_devptr in,
                         uint32_t pitch, mg_devptr ids) {
    return argmax(b, s, "mg_argmax_bf16", MG_ARGMAX_BF16_KERNEL, 2, rows, cols, in, pitch, ids);
}

/* BF16 [count] for the synthetic-data helpers: count >= 1, within the address space. */
static mg_status check_count(const char *fn, uint64_t count) {
    if (!count || count > SIZE_MAX / 2)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: count=%llu (1 to %zu)", fn,
                        (unsigned long long)count, (size_t)(SIZE_MAX / 2));
    return MG_OK;
}

static mg_dim3 fill_grid(uint64_t count) {
    uint64_t blocks = (count + 8ull * FILL_THREADS - 1) / (8ull * FILL_THREADS);
    return (mg_dim3){blocks < MAX_BLOCKS ? (uint32_t)blocks : MAX_BLOCKS, 1, 1};
}

mg_status mg_fill_uniform_bf16(mg_backend *b, mg_stream *s, uint64_t count, uint64_t counter,
                               float offset, float scale, mg_devptr out) {
    static const char fn[] = "mg_fill_uniform_bf16";
    mg_status st = mg_op_enter(b, fn);
    if (st || (st = check_count(fn, count)))
        return st;
    if (!isfinite(offset) || !isfinite(scale))
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: offset=%g scale=%g (both finite)", fn,
                        (double)offset, (double)scale);
    mg_op_tensor t[] = {{"out", out, (size_t)count * 2, 16, MG_OP_OUT}};
    if ((st = mg_op_check_tensors(b, fn, t, 1, -1, -1)))
        return st;
    mg_launch l;
    mg_launch_init(&l, fill_grid(count), (mg_dim3){FILL_THREADS, 1, 1}, 0);
    mg_launch_arg_ptr(&l, out);
    mg_launch_arg_u64(&l, count);
    mg_launch_arg_u64(&l, counter);
    mg_launch_arg_f32(&l, offset);
    mg_launch_arg_f32(&l, scale);
    return launch(b, s, MG_OP_FILL_UNIFORM, fn, MG_FILL_UNIFORM_KERNEL, &l);
}

mg_status mg_amax_bf16(mg_backend *b, mg_stream *s, uint64_t count, mg_devptr x, mg_devptr out) {
    static const char fn[] = "mg_amax_bf16";
    mg_status st = mg_op_enter(b, fn);
    if (st || (st = check_count(fn, count)))
        return st;
    mg_op_tensor t[] = {{"x", x, (size_t)count * 2, 16, MG_OP_IN}, {"out", out, 4, 4, MG_OP_OUT}};
    if ((st = mg_op_check_tensors(b, fn, t, 2, -1, -1)))
        return st;
    /* the kernel raises out to each block's maximum: it starts from +0 */
    if ((st = mg_memset_async(b, out, 0, 4, s)))
        return st;
    mg_launch l;
    mg_launch_init(&l, fill_grid(count), (mg_dim3){FILL_THREADS, 1, 1}, 0);
    mg_launch_arg_ptr(&l, x);
    mg_launch_arg_ptr(&l, out);
    mg_launch_arg_u64(&l, count);
    return launch(b, s, MG_OP_AMAX, fn, MG_AMAX_KERNEL, &l);
}
