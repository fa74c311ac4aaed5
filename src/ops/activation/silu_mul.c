/* silu_mul.c - mg_silu_mul_bf16 (metrale/ops_activation.h): every argument checked once, then
 * kernel "silu_mul_bf16" of module "metrale" launched by name on any backend that ships it
 * (CUDA: kernels/cuda/activation/silu_mul.cu; CPU: silu_mul_reference.c). */
#include "backend_impl.h"
#include "error.h"
#include "metrale/launch.h"
#include "metrale/ops_activation.h"
#include "op_builtin.h"
#include "silu_mul_reference.h"

#define WHAT "mg_silu_mul_bf16"
#define THREADS 256u
#define MAX_BLOCKS 8192u

static const mg_op_provider kernels_provider =
    MG_OP_KERNELS_PROVIDER(mg_silu_mul_cpu_kernels_register, MG_SILU_MUL_KERNEL);

static const mg_op_provider *const silu_mul_providers[] = {&kernels_provider, NULL};

const mg_op_def mg_silu_mul_op = {MG_OP_SILU_MUL, "silu_mul", silu_mul_providers};

mg_status mg_silu_mul_bf16(mg_backend *b, mg_stream *s, uint32_t rows, uint32_t cols, mg_devptr in,
                           uint32_t in_pitch, mg_devptr out, uint32_t out_pitch) {
    mg_status st = mg_op_enter(b, WHAT);
    if (st)
        return st;
    if (!rows || !cols)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, WHAT ": empty shape rows=%u cols=%u", rows, cols);
    if (cols > UINT32_MAX / 2 || in_pitch < 2 * cols)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        WHAT ": in_pitch=%u must be >= 2 * cols (cols=%u: gate and up halves)",
                        in_pitch, cols);
    if (out_pitch < cols)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, WHAT ": out_pitch=%u must be >= cols=%u",
                        out_pitch, cols);
    mg_op_tensor t[] = {{"in", in, mg_op_matrix_bytes(rows, 2 * cols, in_pitch, 2), 2, MG_OP_IN},
                        {"out", out, mg_op_matrix_bytes(rows, cols, out_pitch, 2), 2, MG_OP_OUT}};
    if ((st = mg_op_check_tensors(b, WHAT, t, 2, -1, -1)))
        return st;
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
    const char *name = MG_SILU_MUL_KERNEL;
    return mg_op_run_builtin(b, s, MG_OP_SILU_MUL, WHAT, &name, &l, 1);
}
