/* elementwise.c - mg_gather_rows_bf16, mg_rmsnorm_bf16, mg_argmax_f32 and mg_argmax_bf16
 * (metrale/ops_elementwise.h): every argument checked once, then kernel "gather_rows_bf16",
 * "rmsnorm_bf16", "argmax_f32" or "argmax_bf16" of module "metrale" launched by name on any
 * backend that ships it (CUDA: kernels/cuda/elementwise/elementwise.cu; CPU:
 * elementwise_reference.c). The three ops share one provider, "kernels". */
#include <math.h>
#include <stdio.h>

#include "backend_impl.h"
#include "checked_math.h"
#include "elementwise_reference.h"
#include "error.h"
#include "metrale/launch.h"
#include "metrale/ops_elementwise.h"
#include "op_cache.h"
#include "op_builtin.h"
#include "op_registry.h"

/* Threads per block: one block per row for all three kernels. */
#define ROW_THREADS 256u

static bool kernels_available(mg_backend *b, char *reason, size_t reason_bytes) {
    static const char *const names[] = {MG_GATHER_ROWS_KERNEL, MG_RMSNORM_KERNEL,
                                        MG_ARGMAX_KERNEL, MG_ARGMAX_BF16_KERNEL};
    bool ok = true;
    for (size_t i = 0; ok && i < sizeof names / sizeof names[0]; i++)
        ok = mg_op_builtin_available(b, names[i], mg_elementwise_cpu_kernels_register, reason,
                                     reason_bytes);
    return ok;
}

static const mg_op_provider kernels_provider = {
    .name = "kernels", .backend = MG_OP_ANY_BACKEND, .available = kernels_available};

static const mg_op_provider *const elementwise_providers[] = {&kernels_provider, NULL};

const mg_op_def mg_gather_rows_op = {MG_OP_GATHER_ROWS, "gather_rows", elementwise_providers};
const mg_op_def mg_rmsnorm_op = {MG_OP_RMSNORM, "rmsnorm", elementwise_providers};
const mg_op_def mg_argmax_op = {MG_OP_ARGMAX, "argmax", elementwise_providers};

static mg_status check_backend(mg_backend *b, const char *fn) {
    if (!mg_backend_is_live(b))
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: NULL, invalid or closed backend %p", fn,
                        (void *)b);
    return MG_OK;
}

/* A device buffer of `bytes` at p, aligned to `alignment`. */
static mg_status check_buffer(mg_backend *b, const char *fn, const char *name, mg_devptr p,
                              uint64_t bytes, unsigned alignment) {
    if (!p)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: %s is null", fn, name);
    if (p % alignment)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: %s 0x%llx is not %u-byte aligned", fn, name,
                        (unsigned long long)p, alignment);
    return mg_backend_check_device_range(b, p, (size_t)bytes, fn, name);
}

static bool overlap(mg_devptr a, uint64_t a_bytes, mg_devptr b, uint64_t b_bytes) {
    return a && b && a < b + b_bytes && b < a + a_bytes;
}

/* BF16 packed rows: cols a multiple of 8, the matrix within size_t. */
static mg_status check_bf16_shape(const char *fn, uint32_t rows, uint32_t cols, uint64_t *bytes) {
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

static mg_status launch(mg_backend *b, mg_stream *s, mg_op op, const char *fn,
                        const char *kernel, mg_launch *l) {
    const mg_op_provider *provider;
    mg_status st = mg_op_choose(b, op, NULL, fn, &provider);
    if (st)
        return st;
    mg_elementwise_cpu_kernels_register();
    if ((st = mg_op_launch_builtin(b, s, kernel, l)))
        return st;
    mg_op_count_call(b, op, provider, false);
    return MG_OK;
}

mg_status mg_gather_rows_bf16(mg_backend *b, mg_stream *s, uint32_t rows, uint32_t cols,
                              mg_devptr ids, uint32_t src_rows, mg_devptr src, mg_devptr add,
                              mg_devptr out) {
    static const char fn[] = "mg_gather_rows_bf16";
    uint64_t out_bytes, src_bytes;
    mg_status st = check_backend(b, fn);
    if (st || (st = check_bf16_shape(fn, rows, cols, &out_bytes)))
        return st;
    if (!src_rows)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: src_rows is 0", fn);
    if ((st = check_bf16_shape(fn, src_rows, cols, &src_bytes)) ||
        (st = check_buffer(b, fn, "ids", ids, (uint64_t)rows * 4, 4)) ||
        (st = check_buffer(b, fn, "src", src, src_bytes, 16)) ||
        (add && (st = check_buffer(b, fn, "add", add, src_bytes, 16))) ||
        (st = check_buffer(b, fn, "out", out, out_bytes, 16)))
        return st;
    if (overlap(out, out_bytes, src, src_bytes) || overlap(out, out_bytes, add, src_bytes) ||
        overlap(out, out_bytes, ids, (uint64_t)rows * 4))
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: out overlaps src, add or ids", fn);
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
    uint64_t bytes;
    mg_status st = check_backend(b, fn);
    if (st || (st = check_bf16_shape(fn, rows, cols, &bytes)))
        return st;
    if (!isfinite(eps) || eps < 0)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: eps=%g must be finite and >= 0", fn,
                        (double)eps);
    if ((st = check_buffer(b, fn, "x", x, bytes, 16)) ||
        (add && (st = check_buffer(b, fn, "add", add, bytes, 16))) ||
        (st = check_buffer(b, fn, "weight", weight, (uint64_t)cols * 2, 16)) ||
        (st = check_buffer(b, fn, "out", out, bytes, 16)))
        return st;
    if (overlap(x, bytes, add, bytes) || overlap(weight, (uint64_t)cols * 2, x, bytes))
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: x overlaps add or weight", fn);
    bool in_place = out == x;
    if (in_place && add)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "%s: out may be x only without an add (x then holds the sum)", fn);
    if ((!in_place && overlap(out, bytes, x, bytes)) || overlap(out, bytes, add, bytes) ||
        overlap(out, bytes, weight, (uint64_t)cols * 2))
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: out overlaps x, add or weight", fn);
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
    mg_status st = check_backend(b, fn);
    if (st)
        return st;
    if (!rows || !cols)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: empty shape rows=%u cols=%u", fn, rows, cols);
    unsigned per_vector = 16 / element_bytes;
    if (pitch < cols || pitch % per_vector)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "%s: pitch=%u must be >= cols=%u and a multiple of %u", fn, pitch, cols,
                        per_vector);
    size_t in_bytes;
    if (!mg_matrix_span_bytes(rows, cols, pitch, element_bytes, &in_bytes))
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: in spans more than the address space", fn);
    if ((st = check_buffer(b, fn, "in", in, in_bytes, 16)) ||
        (st = check_buffer(b, fn, "ids", ids, (uint64_t)rows * 4, 4)))
        return st;
    if (overlap(in, in_bytes, ids, (uint64_t)rows * 4))
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: ids overlap in", fn);
    mg_launch l;
    mg_launch_init(&l, (mg_dim3){rows, 1, 1}, (mg_dim3){ROW_THREADS, 1, 1}, 0);
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
