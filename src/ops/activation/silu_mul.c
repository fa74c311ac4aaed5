/* silu_mul.c - mg_silu_mul_bf16 (metrale/ops_activation.h): every argument checked once, then
 * kernel "silu_mul_bf16" of module "metrale" launched by name on any backend that ships it
 * (CUDA: kernels/cuda/activation/silu_mul.cu; CPU: silu_mul_reference.c). */
#include <stdio.h>

#include "backend_impl.h"
#include "checked_math.h"
#include "error.h"
#include "metrale/launch.h"
#include "metrale/ops_activation.h"
#include "op_cache.h"
#include "op_builtin.h"
#include "op_registry.h"
#include "silu_mul_reference.h"

#define WHAT "mg_silu_mul_bf16"
#define THREADS 256u
#define MAX_BLOCKS 8192u

static bool kernels_available(mg_backend *b, char *reason, size_t reason_bytes) {
    return mg_op_builtin_available(b, MG_SILU_MUL_KERNEL, mg_silu_mul_cpu_kernels_register, reason, reason_bytes);
}

static const mg_op_provider kernels_provider = {
    .name = "kernels", .backend = MG_OP_ANY_BACKEND, .available = kernels_available};

static const mg_op_provider *const silu_mul_providers[] = {&kernels_provider, NULL};

const mg_op_def mg_silu_mul_op = {MG_OP_SILU_MUL, "silu_mul", silu_mul_providers};

static mg_status check_matrix(mg_backend *b, const char *name, mg_devptr p, uint32_t rows,
                              uint32_t cols, uint32_t pitch, size_t *bytes) {
    if (!p)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, WHAT ": %s is null", name);
    if (p % 2)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, WHAT ": %s 0x%llx is not 2-byte aligned", name,
                        (unsigned long long)p);
    if (!mg_matrix_span_bytes(rows, cols, pitch, 2, bytes))
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, WHAT ": %s spans more than the address space",
                        name);
    return mg_backend_check_device_range(b, p, *bytes, WHAT, name);
}

mg_status mg_silu_mul_bf16(mg_backend *b, mg_stream *s, uint32_t rows, uint32_t cols,
                           mg_devptr in, uint32_t in_pitch, mg_devptr out, uint32_t out_pitch) {
    if (!mg_backend_is_live(b))
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, WHAT ": NULL, invalid or closed backend %p",
                        (void *)b);
    if (!rows || !cols)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, WHAT ": empty shape rows=%u cols=%u", rows, cols);
    if (cols > UINT32_MAX / 2 || in_pitch < 2 * cols)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        WHAT ": in_pitch=%u must be >= 2 * cols (cols=%u: gate and up halves)",
                        in_pitch, cols);
    if (out_pitch < cols)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, WHAT ": out_pitch=%u must be >= cols=%u",
                        out_pitch, cols);
    size_t in_bytes, out_bytes;
    mg_status st = check_matrix(b, "in", in, rows, 2 * cols, in_pitch, &in_bytes);
    if (st || (st = check_matrix(b, "out", out, rows, cols, out_pitch, &out_bytes)))
        return st;
    if (in < out + out_bytes && out < in + in_bytes)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, WHAT ": in and out overlap");
    const mg_op_provider *provider;
    if ((st = mg_op_choose(b, MG_OP_SILU_MUL, NULL, WHAT, &provider)))
        return st;
    mg_silu_mul_cpu_kernels_register();
    uint64_t total = (uint64_t)rows * cols;
    uint64_t blocks = (total + THREADS - 1) / THREADS;
    mg_launch l;
    mg_launch_init(&l, (mg_dim3){blocks < MAX_BLOCKS ? (uint32_t)blocks : MAX_BLOCKS, 1, 1},
                   (mg_dim3){THREADS, 1, 1}, 0);
    mg_launch_arg_ptr(&l, in);
    mg_launch_arg_ptr(&l, out);
    mg_launch_arg_u32(&l, rows);
    mg_launch_arg_u32(&l, cols);
    mg_launch_arg_u32(&l, in_pitch);
    mg_launch_arg_u32(&l, out_pitch);
    if ((st = mg_op_launch_builtin(b, s, MG_SILU_MUL_KERNEL, &l)))
        return st;
    mg_op_count_call(b, MG_OP_SILU_MUL, provider, false);
    return MG_OK;
}
