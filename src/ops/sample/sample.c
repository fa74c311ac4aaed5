/* sample.c - mg_sample (metrale/ops_sample.h): every argument checked once, then kernel
 * "sample_rows" of module "metrale" launched by name on any backend that ships it (CUDA:
 * kernels/cuda/sample/sample.cu; Metal: kernels/metal/sample.metal; CPU: sample_reference.c),
 * one block per row. */
#include <stdio.h>

#include "backend_impl.h"
#include "checked_math.h"
#include "error.h"
#include "metrale/launch.h"
#include "metrale/ops.h"
#include "metrale/ops_sample.h"
#include "op_builtin.h"
#include "philox.h"
#include "sample_reference.h"

static const mg_op_provider kernels_provider =
    MG_OP_KERNELS_PROVIDER(mg_sample_cpu_kernels_register, MG_SAMPLE_KERNEL);

static const mg_op_provider *const sample_providers[] = {&kernels_provider, NULL};

const mg_op_def mg_sample_op = {MG_OP_SAMPLE, "sample", sample_providers};

mg_sample_params mg_sample_params_greedy(void) {
    return (mg_sample_params){
        .temperature = 0.0f, .top_p = 1.0f, .min_p = 0.0f, .repetition_penalty = 1.0f};
}

float mg_sample_uniform(uint64_t seed, uint64_t step) {
    return mg_sample_uniform_of(seed, step);
}

void mg_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]) {
    mg_philox4x32_10_block(ctr, key, out);
}

static bool desc_valid(const mg_sample_desc *d) {
    return d && d->rows && d->vocab && d->vocab <= INT32_MAX &&
           d->history_pitch <= MG_SAMPLE_MAX_HISTORY &&
           (d->logits_dtype == MG_DTYPE_F32 || d->logits_dtype == MG_DTYPE_BF16) &&
           (!d->logits_pitch || d->logits_pitch >= d->vocab);
}

size_t mg_sample_workspace_bytes(const mg_sample_desc *d) {
    if (!desc_valid(d))
        return 0;
    const uint64_t bytes = (uint64_t)d->rows * 4 * mg_sample_row_floats(d->vocab);
    return bytes > SIZE_MAX ? 0 : (size_t)bytes;
}

mg_status mg_sample_params_check(const mg_sample_params *p, uint32_t vocab,
                                 uint32_t history_pitch) {
    static const char fn[] = "mg_sample_params_check";
    if (!p)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: NULL parameters", fn);
    if (!vocab || vocab > INT32_MAX)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: vocab=%u is outside [1, 2^31)", fn, vocab);
    char reason[160];
    if (!mg_sample_params_valid(p, vocab, history_pitch, reason, sizeof reason))
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: %s", fn, reason);
    return MG_OK;
}

mg_status mg_sample(mg_backend *b, mg_stream *s, const mg_sample_desc *d, mg_devptr logits,
                    mg_devptr params, mg_devptr history, mg_devptr workspace,
                    size_t workspace_bytes, mg_devptr ids) {
    static const char fn[] = "mg_sample";
    mg_status st = mg_op_enter(b, fn);
    if (st)
        return st;
    if (!d)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: NULL descriptor", fn);
    if (!d->rows || !d->vocab || d->vocab > INT32_MAX)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "%s: rows=%u vocab=%u: both must be >= 1, vocab "
                        "< 2^31",
                        fn, d->rows, d->vocab);
    if (d->logits_dtype != MG_DTYPE_F32 && d->logits_dtype != MG_DTYPE_BF16)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: logits_dtype %s is neither F32 nor BF16", fn,
                        mg_dtype_name(d->logits_dtype));
    const uint32_t pitch = d->logits_pitch ? d->logits_pitch : d->vocab;
    if (pitch < d->vocab)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: logits_pitch=%u is less than vocab=%u", fn,
                        pitch, d->vocab);
    if (d->history_pitch > MG_SAMPLE_MAX_HISTORY)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: history_pitch=%u exceeds %u", fn,
                        d->history_pitch, MG_SAMPLE_MAX_HISTORY);
    const size_t need = mg_sample_workspace_bytes(d);
    if (!need)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: the workspace size overflows", fn);
    if (workspace_bytes < need)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "%s: workspace_bytes=%zu is less than mg_sample_workspace_bytes=%zu", fn,
                        workspace_bytes, need);
    const uint32_t size = d->logits_dtype == MG_DTYPE_BF16 ? 2 : 4;
    size_t logit_bytes;
    if (!mg_matrix_span_bytes(d->rows, d->vocab, pitch, size, &logit_bytes))
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: logits span more than the address space", fn);
    mg_op_tensor t[] = {
        {"logits", logits, logit_bytes, size, MG_OP_IN},
        {"params", params, (size_t)d->rows * sizeof(mg_sample_params), 8, MG_OP_IN},
        {"workspace", workspace, need, 16, MG_OP_OUT},
        {"ids", ids, (size_t)d->rows * 4, 4, MG_OP_OUT},
        {"history", history, (size_t)d->rows * d->history_pitch * 4, 4, MG_OP_IN},
    };
    st = mg_op_check_tensors(b, fn, t, d->history_pitch ? 5 : 4, -1, -1);
    if (st)
        return st;
    mg_launch l;
    mg_launch_init(&l, (mg_dim3){d->rows, 1, 1}, (mg_dim3){MG_SAMPLE_THREADS, 1, 1}, 0);
    mg_launch_arg_ptr(&l, logits);
    mg_launch_arg_ptr(&l, params);
    mg_launch_arg_ptr(&l, d->history_pitch ? history : 0);
    mg_launch_arg_ptr(&l, workspace);
    mg_launch_arg_ptr(&l, ids);
    mg_launch_arg_u32(&l, d->rows);
    mg_launch_arg_u32(&l, d->vocab);
    mg_launch_arg_u32(&l, pitch);
    mg_launch_arg_u32(&l, size == 2);
    mg_launch_arg_u32(&l, d->history_pitch);
    const char *name = MG_SAMPLE_KERNEL;
    return mg_op_run_builtin(b, s, MG_OP_SAMPLE, fn, &name, &l, 1);
}
