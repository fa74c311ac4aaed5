/* moe_gemm.c - the grouped per-expert GEMM op (metrale/ops_moe_gemm.h): every argument checked
 * once, the workspace sized by the chosen provider, then the provider runs (CUDA: CUTLASS's
 * Hopper grouped GEMMs, moe_gemm_cuda.c; CPU: the reference, moe_gemm_reference.c). */
#include "backend_impl.h"
#include "checked_math.h"
#include "error.h"
#include "metrale/ops_gemm.h"
#include "metrale/ops_moe.h"
#include "moe_gemm_provider.h"
#include "op_builtin.h"

static const mg_op_provider *const moe_gemm_providers[] = {
#ifdef METRALE_HAVE_CUDA
    &mg_moe_gemm_cutlass_provider.base,
#endif
    &mg_moe_gemm_reference_provider.base,
    NULL,
};

const mg_op_def mg_moe_gemm_op = {MG_OP_MOE_GEMM, "moe_gemm", moe_gemm_providers};

/* CUTLASS's problem shapes are ints. */
#define MAX_EXTENT 0x7fffffffu

static const char *kind_name(mg_moe_gemm_kind kind) {
    switch (kind) {
    case MG_MOE_GEMM_BF16:
        return "BF16";
    case MG_MOE_GEMM_FP8_ROWWISE:
        return "FP8 row-wise";
    case MG_MOE_GEMM_FP8_BLOCKSCALED:
        return "FP8 128x128 block-scaled";
    }
    return NULL;
}

/* The descriptor checked, its defaults resolved into c. */
static mg_status check_desc(const char *fn, const mg_moe_gemm_desc *d, mg_moe_gemm_call *c) {
    if (!d)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: NULL descriptor", fn);
    if (!kind_name(d->kind))
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: unknown kind %d", fn, (int)d->kind);
    if (!d->experts || d->experts > MG_MOE_MAX_EXPERTS)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: experts=%u is outside 1..%u", fn, d->experts,
                        MG_MOE_MAX_EXPERTS);
    if (!d->rows || !d->act_rows || !d->n || !d->k)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "%s: rows=%u act_rows=%u n=%u k=%u must all be >= 1", fn, d->rows,
                        d->act_rows, d->n, d->k);
    uint64_t n_w = (uint64_t)d->n * (d->gate_up ? 2 : 1);
    if (d->rows > MAX_EXTENT || n_w > MAX_EXTENT || d->k > MAX_EXTENT)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: rows=%u, weight rows %llu or k=%u exceed %u",
                        fn, d->rows, (unsigned long long)n_w, d->k, MAX_EXTENT);
    c->d = *d;
    c->n_w = (uint32_t)n_w;
    c->d.act_pitch = d->act_pitch ? d->act_pitch : d->k;
    c->d.ldc = d->ldc ? d->ldc : d->n;
    if (c->d.act_pitch < d->k || c->d.act_pitch % 8)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "%s: act_pitch=%u must be >= k=%u and a multiple of 8 (16-byte rows)", fn,
                        c->d.act_pitch, d->k);
    if (c->d.ldc < d->n)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: ldc=%u is less than n=%u", fn, c->d.ldc,
                        d->n);
    if (d->kind != MG_MOE_GEMM_BF16 && (d->k % 16 || n_w % 16))
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "%s: %s weights need k=%u and weight rows %llu multiples of 16", fn,
                        kind_name(d->kind), d->k, (unsigned long long)n_w);
    return MG_OK;
}

/* FP32 scales of one expert's weight. */
static size_t weight_scale_count(const mg_moe_gemm_call *c) {
    if (c->d.kind == MG_MOE_GEMM_FP8_ROWWISE)
        return c->n_w;
    uint32_t blocks = MG_FP8_SCALE_BLOCK;
    return (size_t)((c->n_w + blocks - 1) / blocks) * ((c->d.k + blocks - 1) / blocks);
}

static mg_status check_tensors(mg_backend *b, const char *fn, const mg_moe_gemm_call *c,
                               size_t workspace_needed) {
    const mg_moe_gemm_desc *d = &c->d;
    const mg_moe_gemm_tensors *t = &c->t;
    bool fp8 = d->kind != MG_MOE_GEMM_BF16;
    if (!t->sorted_token_ids && d->act_rows < d->rows)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "%s: without sorted_token_ids row r reads act row r, so act_rows=%u must "
                        "be >= rows=%u",
                        fn, d->act_rows, d->rows);
    if (!fp8 && t->weight_scale)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: weight_scale must be 0 for BF16 weights", fn);
    if (t->workspace_bytes < workspace_needed)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "%s: workspace_bytes=%zu, this call needs %zu "
                        "(mg_moe_gemm_workspace_bytes)",
                        fn, t->workspace_bytes, workspace_needed);
    mg_op_tensor s[7];
    int count = 0;
    s[count] = (mg_op_tensor){"out", t->out, 0, 16, MG_OP_OUT};
    if (!mg_matrix_span_bytes(d->rows, d->n, d->ldc, 2, &s[count++].bytes))
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: out spans more than the address space", fn);
    s[count] = (mg_op_tensor){"act", t->act, 0, 16, MG_OP_IN};
    if (!mg_matrix_span_bytes(d->act_rows, d->k, d->act_pitch, 2, &s[count++].bytes))
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: act spans more than the address space", fn);
    s[count] = (mg_op_tensor){"weight", t->weight, 0, 16, MG_OP_IN};
    size_t per_expert;
    if (!mg_mul_size((size_t)c->n_w * d->k, fp8 ? 1 : 2, &per_expert) ||
        !mg_mul_size(per_expert, d->experts, &s[count++].bytes))
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: weight spans more than the address space",
                        fn);
    if (fp8)
        s[count++] = (mg_op_tensor){"weight_scale", t->weight_scale,
                                    weight_scale_count(c) * d->experts * 4, 4, MG_OP_IN};
    s[count++] = (mg_op_tensor){"expert_offsets", t->expert_offsets, ((size_t)d->experts + 1) * 4,
                                4, MG_OP_IN};
    if (t->sorted_token_ids)
        s[count++] = (mg_op_tensor){"sorted_token_ids", t->sorted_token_ids, (size_t)d->rows * 4, 4,
                                    MG_OP_IN};
    if (workspace_needed)
        s[count++] = (mg_op_tensor){"workspace", t->workspace, t->workspace_bytes, 256, MG_OP_OUT};
    /* out and the workspace are written: neither may overlap anything. */
    return mg_op_check_tensors(b, fn, s, count, -1, -1);
}

static mg_status choose(mg_backend *b, const char *fn, const mg_moe_gemm_call *c,
                        const mg_moe_gemm_provider **out) {
    const mg_op_provider *p;
    mg_status st = mg_op_choose(b, MG_OP_MOE_GEMM, c, fn, &p);
    if (!st)
        *out = (const mg_moe_gemm_provider *)p;
    return st;
}

mg_status mg_moe_gemm_workspace_bytes(mg_backend *b, const mg_moe_gemm_desc *d, size_t *bytes) {
    static const char fn[] = "mg_moe_gemm_workspace_bytes";
    mg_status st = mg_op_enter(b, fn);
    if (st)
        return st;
    if (!bytes)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: NULL bytes", fn);
    mg_moe_gemm_call c = {0};
    st = check_desc(fn, d, &c);
    const mg_moe_gemm_provider *p;
    if (st || (st = choose(b, fn, &c, &p)))
        return st;
    return p->workspace_bytes ? p->workspace_bytes(b, &c, bytes) : (*bytes = 0, MG_OK);
}

mg_status mg_moe_gemm(mg_backend *b, mg_stream *s, const mg_moe_gemm_desc *d,
                      const mg_moe_gemm_tensors *t) {
    static const char fn[] = "mg_moe_gemm";
    mg_status st = mg_op_enter(b, fn);
    if (st)
        return st;
    if (!t)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: NULL tensors", fn);
    mg_moe_gemm_call c = {0};
    st = check_desc(fn, d, &c);
    const mg_moe_gemm_provider *p;
    if (st || (st = choose(b, fn, &c, &p)))
        return st;
    size_t needed = 0;
    if (p->workspace_bytes && (st = p->workspace_bytes(b, &c, &needed)))
        return st;
    c.t = *t;
    if ((st = check_tensors(b, fn, &c, needed)) || (st = p->run(b, s, &c)))
        return st;
    mg_op_count_call(b, MG_OP_MOE_GEMM, &p->base, needed > 0);
    return MG_OK;
}
