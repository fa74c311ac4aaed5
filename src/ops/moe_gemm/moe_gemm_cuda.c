/* moe_gemm_cuda.c - the grouped MoE GEMM on the CUDA backend (metrale/ops_moe_gemm.h): CUTLASS's
 * Hopper pointer-array grouped GEMMs in the CUTLASS plugin (kernels/cuda/cutlass/
 * cutlass_moe_sm90.h), then for the gate_up form mg_silu_mul_bf16 from the [rows, 2n]
 * intermediate the GEMM wrote into the workspace.
 *
 * Workspace, from its (256-byte aligned) start: the intermediate (gate_up form only), then the
 * plugin's part (gathered activations, per-expert arguments, CUTLASS's own workspace). */
#include <stdio.h>

#include "cuda_backend.h"
#include "cutlass_loader.h"
#include "cutlass_moe_sm90.h"
#include "error.h"
#include "metrale/ops_activation.h"
#include "moe_gemm_provider.h"

#define ALIGN 256u

typedef struct unit_entry {
    const char *what;
    uint32_t unit;
    const char *workspace_name, *run_name;
} unit_entry;

static const unit_entry bf16_unit = {"BF16 grouped MoE GEMM on CUDA", MG_CUTLASS_UNITS_SM90_MOE,
                                     MG_CUTLASS_MOE_SM90_BF16_WORKSPACE,
                                     MG_CUTLASS_MOE_SM90_BF16_RUN};
static const unit_entry block_unit = {
    "FP8 block-scaled grouped MoE GEMM on CUDA", MG_CUTLASS_UNITS_SM90_MOE_FP8,
    MG_CUTLASS_MOE_SM90_FP8_WORKSPACE, MG_CUTLASS_MOE_SM90_FP8_RUN};
static const unit_entry rowwise_unit = {
    "FP8 row-wise grouped MoE GEMM on CUDA", MG_CUTLASS_UNITS_SM90_MOE_FP8_ROWWISE,
    MG_CUTLASS_MOE_SM90_FP8_ROWWISE_WORKSPACE, MG_CUTLASS_MOE_SM90_FP8_ROWWISE_RUN};

static const unit_entry *unit_of(mg_moe_gemm_kind kind) {
    return kind == MG_MOE_GEMM_BF16          ? &bf16_unit
           : kind == MG_MOE_GEMM_FP8_ROWWISE ? &rowwise_unit
                                             : &block_unit;
}

/* The unit's entry points, resolved on first use (the loader remembers the plugin). */
static mg_status resolve(const unit_entry *u, mg_cutlass_moe_sm90_workspace_fn *workspace,
                         mg_cutlass_moe_sm90_run_fn *run) {
    mg_cuda_plugin_symbol symbols[] = {{u->workspace_name, (void **)workspace},
                                       {u->run_name, (void **)run}};
    return mg_cutlass_plugin_resolve(u->what, u->unit, symbols, 2);
}

static size_t intermediate_bytes(const mg_moe_gemm_call *c) {
    size_t bytes = c->d.gate_up ? (size_t)c->d.rows * c->n_w * 2 : 0;
    return (bytes + ALIGN - 1) / ALIGN * ALIGN;
}

static mg_cutlass_moe_problem problem_of(const mg_moe_gemm_call *c) {
    const mg_moe_gemm_desc *d = &c->d;
    const mg_moe_gemm_tensors *t = &c->t;
    size_t skip = intermediate_bytes(c);
    return (mg_cutlass_moe_problem){
        .kind = (uint32_t)d->kind,
        .experts = d->experts,
        .rows = d->rows,
        .act_rows = d->act_rows,
        .n_w = c->n_w,
        .k = d->k,
        .act_pitch = d->act_pitch,
        .ldd = d->gate_up ? c->n_w : d->ldc,
        .act = (const void *)(uintptr_t)t->act,
        .token_ids = (const int32_t *)(uintptr_t)t->sorted_token_ids,
        .expert_offsets = (const int32_t *)(uintptr_t)t->expert_offsets,
        .weight = (const void *)(uintptr_t)t->weight,
        .weight_scale = (const float *)(uintptr_t)t->weight_scale,
        .d = (void *)(uintptr_t)(d->gate_up ? t->workspace : t->out),
        .workspace = t->workspace ? (void *)(uintptr_t)(t->workspace + skip) : NULL,
        .workspace_bytes = t->workspace_bytes > skip ? t->workspace_bytes - skip : 0,
    };
}

static mg_status cutlass_workspace_bytes(mg_backend *b, const mg_moe_gemm_call *c, size_t *bytes) {
    mg_cutlass_moe_sm90_workspace_fn workspace;
    mg_cutlass_moe_sm90_run_fn run;
    const unit_entry *u = unit_of(c->d.kind);
    mg_cuda_context *ctx;
    mg_status st = resolve(u, &workspace, &run);
    if (st || (st = mg_cuda_bind(b, &ctx)))
        return st;
    mg_cutlass_moe_problem p = problem_of(c);
    mg_plugin_error err;
    size_t plugin_bytes = 0;
    if ((st = workspace(&p, &plugin_bytes, &err)))
        return mg_cuda_plugin_failure(ctx, st, err.cuda_error, err.message, u->what);
    *bytes = intermediate_bytes(c) + plugin_bytes;
    return MG_OK;
}

static mg_status cutlass_run(mg_backend *b, mg_stream *s, const mg_moe_gemm_call *c) {
    mg_cutlass_moe_sm90_workspace_fn workspace;
    mg_cutlass_moe_sm90_run_fn run;
    const unit_entry *u = unit_of(c->d.kind);
    mg_cuda_context *ctx;
    CUstream stream;
    mg_status st = resolve(u, &workspace, &run);
    if (st || (st = mg_cuda_bind(b, &ctx)) || (st = mg_cuda_stream(b, s, &stream)))
        return st;
    mg_cutlass_moe_problem p = problem_of(c);
    mg_plugin_error err;
    if ((st = run(&p, (void *)stream, &err)))
        return mg_cuda_plugin_failure(ctx, st, err.cuda_error, err.message, u->what);
    if (!c->d.gate_up)
        return MG_OK;
    return mg_silu_mul_bf16(b, s, c->d.rows, c->d.n, c->t.workspace, c->n_w, c->t.out, c->d.ldc);
}

/* sm_90a code runs on compute capability 9.0 only; the plugin must hold the BF16 unit. */
static bool cutlass_available(mg_backend *b, char *reason, size_t reason_bytes) {
    mg_error_state saved;
    mg_error_save(&saved);
    mg_device_info info;
    bool hopper = mg_device_get_info(b, &info) == MG_OK && info.cc_major == 9 && info.cc_minor == 0;
    mg_error_restore(&saved);
    if (!hopper) {
        snprintf(reason, reason_bytes, "needs a compute capability 9.0 device (sm_90a kernels)");
        return false;
    }
    if (!(mg_cutlass_plugin_units() & MG_CUTLASS_UNITS_SM90_MOE)) {
        snprintf(reason, reason_bytes,
                 "the CUTLASS plugin is missing or was built without the Hopper MoE kernels");
        return false;
    }
    return true;
}

/* The TMA rows of 16 bytes the kernels need, and the unit of the kind. */
static bool cutlass_supports(mg_backend *b, const void *call, char *reason, size_t reason_bytes) {
    (void)b;
    const mg_moe_gemm_call *c = call;
    if (!(mg_cutlass_plugin_units() & unit_of(c->d.kind)->unit)) {
        snprintf(reason, reason_bytes, "the CUTLASS plugin was built without the %s",
                 unit_of(c->d.kind)->what);
        return false;
    }
    uint32_t align = c->d.kind == MG_MOE_GEMM_BF16 ? 8 : 16;
    if (c->d.k % align || c->n_w % align || (!c->d.gate_up && c->d.ldc % 8)) {
        snprintf(reason, reason_bytes,
                 "needs k=%u and weight rows %u multiples of %u and ldc=%u a multiple of 8 "
                 "(16-byte TMA rows)",
                 c->d.k, c->n_w, align, c->d.ldc);
        return false;
    }
    return true;
}

const mg_moe_gemm_provider mg_moe_gemm_cutlass_provider = {
    .base = {.name = "cutlass",
             .backend = MG_BACKEND_CUDA,
             .available = cutlass_available,
             .supports = cutlass_supports},
    .workspace_bytes = cutlass_workspace_bytes,
    .run = cutlass_run,
};
