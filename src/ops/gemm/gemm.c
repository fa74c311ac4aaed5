/* gemm.c - the front of the GEMM ops (metrale/ops_gemm.h): every argument checked once, then
 * the provider the op registry chooses (gemm_provider.h). */
#include <math.h>
#include <stdio.h>

#include "backend_impl.h"
#include "error.h"
#include "gemm_provider.h"
#include "gemm_reference.h"
#include "kv_cache_host.h"
#include "metrale/launch.h"
#include "op_builtin.h"

/* The providers of both GEMM ops, in order of preference. The decode GEMV and CUTLASS come first
 * but take, in the automatic choice, only the shapes measured faster on them (decode GEMV: small
 * M, gemm_decode_gemv_cuda.c; CUTLASS: the BF16 shapes of gemm_cutlass_table.c).
 * On the CPU backend the fast BF16 providers come before the reference, which stays last of
 * them: it defines the results and is reached by forcing "reference" (and runs every FP8 GEMM).
 * The BF16 op also has the kernel-by-name GEMM ("kernels") after it: it serves the backends with
 * none of the above (Metal), and on the CPU runs the reference only when forced. The FP8 op
 * leaves it out, so a backend with only that one is asked (mg_op_supported) and answers no. */
#ifdef METRALE_HAVE_CUDA
#define CUDA_GEMM_PROVIDERS                                                                        \
    &mg_gemm_decode_gemv_provider.base, &mg_gemm_cutlass_provider.base,                            \
        &mg_gemm_cublaslt_provider.base,
#else
#define CUDA_GEMM_PROVIDERS
#endif
#define GEMM_PROVIDERS                                                                             \
    CUDA_GEMM_PROVIDERS &mg_gemm_cpu_avx2_provider.base, &mg_gemm_cpu_portable_provider.base,      \
        &mg_gemm_reference_provider.base
static const mg_op_provider *const gemm_providers[] = {GEMM_PROVIDERS,
                                                       &mg_gemm_kernels_provider.base, NULL};
static const mg_op_provider *const gemm_fp8_providers[] = {GEMM_PROVIDERS, NULL};

const mg_op_def mg_gemm_bf16_op = {MG_OP_GEMM_BF16, "gemm_bf16", gemm_providers};
const mg_op_def mg_gemm_fp8_op = {MG_OP_GEMM_FP8, "gemm_fp8", gemm_fp8_providers};

static const mg_gemm_kind_info gemm_kinds[MG_GEMM_KIND_COUNT] = {
    {MG_GEMM_BF16, "bf16", "mg_gemm_bf16", MG_DTYPE_BF16, MG_OP_GEMM_BF16},
    {MG_GEMM_FP8_TENSORWISE, "fp8_tensor", "mg_gemm_fp8_tensorwise", MG_DTYPE_FP8_E4M3,
     MG_OP_GEMM_FP8},
    {MG_GEMM_FP8_ROWWISE, "fp8_row", "mg_gemm_fp8_rowwise", MG_DTYPE_FP8_E4M3, MG_OP_GEMM_FP8},
    {MG_GEMM_FP8_BLOCKSCALED, "fp8_block", "mg_gemm_fp8_blockscaled", MG_DTYPE_FP8_E4M3,
     MG_OP_GEMM_FP8},
};

const mg_gemm_kind_info *mg_gemm_kind_describe(mg_gemm_kind kind) {
    return (unsigned)kind < MG_GEMM_KIND_COUNT ? &gemm_kinds[kind] : NULL;
}

/* The kind's op; callers have checked the kind (check_plan). */
static mg_op op_of(mg_gemm_kind kind) {
    return gemm_kinds[kind].op;
}

static const char *kind_name(mg_gemm_kind kind) {
    const mg_gemm_kind_info *info = mg_gemm_kind_describe(kind);
    return info ? info->function : "mg_gemm";
}

static const char *const prologue_names[MG_GEMM_PROLOGUE_COUNT] = {"none", "rmsnorm"};
static const char *const epilogue_names[MG_GEMM_EPILOGUE_COUNT] = {
    "none", "residual_add", "silu_mul", "argmax", "kv_append"};

const char *mg_gemm_prologue_name(mg_gemm_prologue p) {
    return (unsigned)p < MG_GEMM_PROLOGUE_COUNT ? prologue_names[p] : NULL;
}

const char *mg_gemm_epilogue_name(mg_gemm_epilogue e) {
    return (unsigned)e < MG_GEMM_EPILOGUE_COUNT ? epilogue_names[e] : NULL;
}

static bool has_fusion(const mg_gemm_plan *p) {
    return p->fusion.prologue != MG_GEMM_PROLOGUE_NONE ||
           p->fusion.epilogue != MG_GEMM_EPILOGUE_NONE;
}

/* "prologue rmsnorm + epilogue silu_mul", for messages; the kinds are checked. */
static void fusion_text(const mg_gemm_plan *p, char *buf, size_t bytes) {
    bool pro = p->fusion.prologue != MG_GEMM_PROLOGUE_NONE;
    bool epi = p->fusion.epilogue != MG_GEMM_EPILOGUE_NONE;
    snprintf(buf, bytes, "%s%s%s%s%s", pro ? "prologue " : "",
             pro ? prologue_names[p->fusion.prologue] : "", pro && epi ? " + " : "",
             epi ? "epilogue " : "", epi ? epilogue_names[p->fusion.epilogue] : "");
}

bool mg_gemm_fusion_declared(const mg_gemm_provider *g, const mg_gemm_plan *p, char *reason,
                             size_t reason_bytes) {
    if (!has_fusion(p))
        return true;
    unsigned want =
        MG_GEMM_FUSES_PROLOGUE(p->fusion.prologue) | MG_GEMM_FUSES_EPILOGUE(p->fusion.epilogue);
    want &= ~(MG_GEMM_FUSES_PROLOGUE(MG_GEMM_PROLOGUE_NONE) |
              MG_GEMM_FUSES_EPILOGUE(MG_GEMM_EPILOGUE_NONE));
    if ((g->fusions & want) == want)
        return true;
    char text[96];
    fusion_text(p, text, sizeof text);
    snprintf(reason, reason_bytes, "runs no fusion %s", text);
    return false;
}

static bool is_fp8(mg_gemm_kind kind) {
    return gemm_kinds[kind].input_type == MG_DTYPE_FP8_E4M3;
}

size_t mg_gemm_scale_count(const mg_gemm_plan *p, bool act) {
    uint32_t rows = act ? p->m : p->n;
    switch (p->kind) {
    case MG_GEMM_BF16:
        return 0;
    case MG_GEMM_FP8_TENSORWISE:
        return 1;
    case MG_GEMM_FP8_ROWWISE:
        return rows;
    case MG_GEMM_FP8_BLOCKSCALED:
        return mg_fp8_block_scale_count(act ? p->act_mode : p->weight_mode, rows, p->k);
    }
    return 0;
}

mg_status mg_gemm_quantize_operand(const mg_gemm_plan *p, bool act, const uint16_t *bf16,
                                   uint32_t rows, uint8_t *codes, float *scales) {
    if (!p)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "mg_gemm_quantize_operand: plan is NULL");
    switch (p->kind) {
    case MG_GEMM_BF16:
        break;
    case MG_GEMM_FP8_TENSORWISE:
        return mg_fp8_quantize_tensorwise(bf16, rows, p->k, codes, scales);
    case MG_GEMM_FP8_ROWWISE:
        return mg_fp8_quantize_rowwise(bf16, rows, p->k, codes, scales);
    case MG_GEMM_FP8_BLOCKSCALED:
        return (act ? p->act_mode : p->weight_mode) == MG_FP8_BLOCK_1X128
                   ? mg_fp8_quantize_1x128(bf16, rows, p->k, codes, scales)
                   : mg_fp8_quantize_128x128(bf16, rows, p->k, codes, scales);
    }
    return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                    "mg_gemm_quantize_operand: kind %d has no FP8 operands to quantize",
                    (int)p->kind);
}

/* The columns of out: N, or N/2 after SiLU(gate) * up. */
static uint32_t out_cols(const mg_gemm_plan *p) {
    return p->fusion.epilogue == MG_GEMM_EPILOGUE_SILU_MUL ? p->n / 2 : p->n;
}

/* The fusion's kinds and scalars (metrale/ops_gemm.h, "fusion"); the shape is checked. */
static mg_status check_fusion(const mg_gemm_plan *p, const char *what) {
    const mg_gemm_fusion *f = &p->fusion;
    if (!mg_gemm_prologue_name(f->prologue) || !mg_gemm_epilogue_name(f->epilogue))
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: unknown fusion (prologue %d, epilogue %d)",
                        what, (int)f->prologue, (int)f->epilogue);
    if (!has_fusion(p))
        return MG_OK;
    char text[96];
    fusion_text(p, text, sizeof text);
    if (p->kind != MG_GEMM_BF16 && p->kind != MG_GEMM_FP8_ROWWISE)
        return MG_ERROR(MG_ERR_UNSUPPORTED,
                        "%s: fusion %s is defined for mg_gemm_bf16 and mg_gemm_fp8_rowwise only",
                        what, text);
    if (f->prologue == MG_GEMM_PROLOGUE_RMSNORM && !(f->eps > 0.0f && f->eps < INFINITY))
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: fusion %s needs eps > 0 and finite, got %g",
                        what, text, (double)f->eps);
    if (f->epilogue == MG_GEMM_EPILOGUE_SILU_MUL && p->n % 2)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "%s: fusion %s needs an even N (gate and up halves), got N=%u", what, text,
                        p->n);
    if (f->epilogue == MG_GEMM_EPILOGUE_SILU_MUL && p->out_type != MG_DTYPE_BF16)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: fusion %s writes bf16, not %s", what, text,
                        mg_dtype_name(p->out_type));
    if (f->epilogue == MG_GEMM_EPILOGUE_KV_APPEND && (p->out_type != MG_DTYPE_BF16 || p->ldc % 8))
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "%s: fusion %s needs bf16 output rows of a multiple of 8 elements (got "
                        "%s, ldc=%u)",
                        what, text, mg_dtype_name(p->out_type), p->ldc);
    if (f->epilogue == MG_GEMM_EPILOGUE_RESIDUAL_ADD && p->out_type != MG_DTYPE_BF16)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: fusion %s writes bf16, not %s", what, text,
                        mg_dtype_name(p->out_type));
    return MG_OK;
}

/* The shape, types and modes of a plan; shared by the calls and mg_gemm_prewarm. */
static mg_status check_plan(const mg_gemm_plan *p) {
    const char *what = kind_name(p->kind);
    if (!mg_gemm_kind_describe(p->kind))
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "mg_gemm: unknown GEMM kind %d", (int)p->kind);
    if (p->m == 0 || p->n == 0 || p->k == 0)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: empty shape M=%u N=%u K=%u", what, p->m, p->n,
                        p->k);
    mg_status st = check_fusion(p, what);
    if (st)
        return st;
    if (p->ldc < out_cols(p))
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: ldc=%u is less than the %u output columns",
                        what, p->ldc, out_cols(p));
    if (p->kind == MG_GEMM_BF16) {
        if (p->out_type != MG_DTYPE_BF16 && p->out_type != MG_DTYPE_F32)
            return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: output type %s, expected bf16 or f32",
                            what, mg_dtype_name(p->out_type));
        return MG_OK;
    }
    if (p->out_type != MG_DTYPE_BF16)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: output type %s, expected bf16", what,
                        mg_dtype_name(p->out_type));
    /* cuBLASLt's FP8 kernels read 16-byte rows; the CPU reference enforces the same so a
     * program that runs here runs on a GPU. */
    if (p->k % 16 || p->n % 16)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "%s: FP8 needs K and N multiples of 16, got N=%u K=%u", what, p->n, p->k);
    if (p->ldc % 8)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "%s: FP8 needs 16-byte output rows (ldc a multiple of 8), got ldc=%u", what,
                        p->ldc);
    if (p->kind != MG_GEMM_FP8_BLOCKSCALED)
        return MG_OK;
    if ((unsigned)p->act_mode > MG_FP8_BLOCK_128X128 ||
        (unsigned)p->weight_mode > MG_FP8_BLOCK_128X128)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: unknown block scale mode (act %d, weight %d)",
                        what, (int)p->act_mode, (int)p->weight_mode);
    if (p->act_mode == MG_FP8_BLOCK_128X128 && p->weight_mode == MG_FP8_BLOCK_128X128)
        return MG_ERROR(MG_ERR_UNSUPPORTED,
                        "%s: scale pair act 128x128 with weight 128x128 is not supported by "
                        "cuBLASLt; use 1x128 scales for one operand",
                        what);
    if (p->m % 4)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "%s: block scaling needs M a multiple of 4, got M=%u (pad the tokens to "
                        "%u; mg_fp8_act_scales_transpose zero-fills the padding scales)",
                        what, p->m, mg_fp8_rows_padded(p->m));
    return MG_OK;
}

/* Largest power of two dividing the address, capped at 16. */
static uint32_t pointer_alignment(mg_devptr p) {
    uint32_t a = 16;
    while (a > 1 && (p % a))
        a /= 2;
    return a;
}

/* No fusion operand the plan's fusion does not read (a caller who sets one expects it used),
 * and no act_scale with the RMSNorm prologue (the op computes it). The needed ones are checked
 * with the other tensors. */
static mg_status check_fusion_tensors(const mg_gemm_call *c, const char *what) {
    const mg_gemm_fusion *f = &c->plan.fusion;
    const mg_gemm_fusion_tensors *t = &c->t.fusion;
    const char *unused = NULL;
    if (t->norm_weight && f->prologue != MG_GEMM_PROLOGUE_RMSNORM)
        unused = "norm_weight";
    else if (t->residual && f->epilogue != MG_GEMM_EPILOGUE_RESIDUAL_ADD)
        unused = "residual";
    else if (t->argmax_ids && f->epilogue != MG_GEMM_EPILOGUE_ARGMAX)
        unused = "argmax_ids";
    else if ((t->kv_cache || t->kv_append) && f->epilogue != MG_GEMM_EPILOGUE_KV_APPEND)
        unused = t->kv_cache ? "kv_cache" : "kv_append";
    else if (c->t.act_scale && f->prologue == MG_GEMM_PROLOGUE_RMSNORM)
        unused = "act_scale";
    if (!unused)
        return MG_OK;
    if (!has_fusion(&c->plan))
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "%s: %s is given but the plan has no fusion (pass 0)", what, unused);
    char text[96];
    fusion_text(&c->plan, text, sizeof text);
    return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                    "%s: %s is given but fusion %s does not read it (pass 0)", what, unused, text);
}

bool mg_gemm_kv_append_args(const mg_gemm_call *c, mg_kv_append_args *out) {
    const mg_gemm_fusion_tensors *t = &c->t.fusion;
    if (c->plan.fusion.epilogue != MG_GEMM_EPILOGUE_KV_APPEND || !t->kv_cache || !t->kv_append)
        return false;
    const uint64_t d = t->kv_cache->head_dim, hq = t->kv_append->num_qo_heads;
    *out = *t->kv_append;
    out->num_tokens = c->plan.m;
    out->k = c->t.out + hq * d * 2;
    out->v = out->k + (uint64_t)t->kv_cache->num_kv_heads * d * 2;
    out->k_stride = out->v_stride = c->plan.ldc;
    out->q = out->rope ? c->t.out : 0;
    out->q_stride = out->rope ? c->plan.ldc : 0;
    return true;
}

/* The KV-append epilogue: its structs, the fields the op sets left 0, N matching the heads,
 * and every check of mg_kv_append on the arguments the op will pass. */
static mg_status check_kv_append(mg_backend *b, const mg_gemm_call *c, const char *what) {
    const mg_gemm_fusion_tensors *t = &c->t.fusion;
    if (!t->kv_cache || !t->kv_append)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: epilogue kv_append needs %s", what,
                        t->kv_cache ? "kv_append (the append's arguments)" : "kv_cache");
    const mg_kv_append_args *a = t->kv_append;
    if (a->k || a->v || a->q || a->k_stride || a->v_stride || a->q_stride || a->num_tokens)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "%s: epilogue kv_append sets k, v, q, their strides and num_tokens from "
                        "out; pass them 0",
                        what);
    uint64_t heads = (uint64_t)a->num_qo_heads + 2ull * t->kv_cache->num_kv_heads;
    if (heads * t->kv_cache->head_dim != c->plan.n)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "%s: epilogue kv_append needs N = (num_qo_heads + 2 num_kv_heads) "
                        "head_dim = (%u + 2 x %u) x %u, got N=%u",
                        what, a->num_qo_heads, t->kv_cache->num_kv_heads, t->kv_cache->head_dim,
                        c->plan.n);
    mg_kv_append_args args;
    mg_gemm_kv_append_args(c, &args);
    return mg_kv_append_check(b, t->kv_cache, &args);
}

/* The operands, each inside its buffer (nothing is read or written out of bounds), and the
 * output overlapping no operand: GEMM reads act and weight while it writes out. */
static mg_status check_call(mg_backend *b, mg_gemm_call *c) {
    const mg_gemm_plan *p = &c->plan;
    const char *what = kind_name(p->kind);
    mg_status st = mg_op_enter(b, what);
    if (st || (st = check_plan(p)))
        return st;
    bool fp8 = is_fp8(p->kind);
    /* The RMSNorm prologue reads the un-normed BF16 rows whatever the kind; FP8's act_scale is
     * then the op's own. */
    bool norm = p->fusion.prologue == MG_GEMM_PROLOGUE_RMSNORM;
    uint32_t in_align = fp8 ? 16 : 2, out_align = fp8 ? 16 : (uint32_t)mg_dtype_bytes(p->out_type);
    uint32_t scale_align = p->kind == MG_GEMM_FP8_TENSORWISE ? 4 : 16;
    size_t in_bytes = mg_dtype_bytes(gemm_kinds[p->kind].input_type);
    size_t act_bytes = norm ? 2 : in_bytes, out_bytes = mg_dtype_bytes(p->out_type);
    if ((st = check_fusion_tensors(c, what)))
        return st;
    if (p->fusion.epilogue == MG_GEMM_EPILOGUE_KV_APPEND && (st = check_kv_append(b, c, what)))
        return st;
    /* The scales only for FP8; a workspace of 0 bytes is none. */
    mg_op_tensor t[11] = {
        {"act", c->t.act, mg_op_matrix_bytes(p->m, p->k, p->k, act_bytes), norm ? 2 : in_align,
         MG_OP_IN},
        {"weight", c->t.weight, mg_op_matrix_bytes(p->n, p->k, p->k, in_bytes), in_align, MG_OP_IN},
        {"out", c->t.out, mg_op_matrix_bytes(p->m, out_cols(p), p->ldc, out_bytes), out_align,
         MG_OP_OUT},
    };
    int count = 3;
    if (fp8 && !norm)
        t[count++] = (mg_op_tensor){"act_scale", c->t.act_scale, mg_gemm_scale_count(p, true) * 4,
                                    scale_align, MG_OP_IN};
    if (fp8)
        t[count++] = (mg_op_tensor){"weight_scale", c->t.weight_scale,
                                    mg_gemm_scale_count(p, false) * 4, scale_align, MG_OP_IN};
    if (norm)
        t[count++] =
            (mg_op_tensor){"norm_weight", c->t.fusion.norm_weight, (size_t)p->k * 2, 2, MG_OP_IN};
    int residual_index = -1; /* the residual may be out itself, exactly (an in-place add) */
    if (p->fusion.epilogue == MG_GEMM_EPILOGUE_RESIDUAL_ADD) {
        residual_index = count;
        t[count++] = (mg_op_tensor){"residual", c->t.fusion.residual,
                                    mg_op_matrix_bytes(p->m, p->n, p->ldc, 2), 2, MG_OP_IN};
    }
    if (p->fusion.epilogue == MG_GEMM_EPILOGUE_ARGMAX)
        t[count++] =
            (mg_op_tensor){"argmax_ids", c->t.fusion.argmax_ids, (size_t)p->m * 4, 4, MG_OP_OUT};
    size_t pool_bytes;
    if (p->fusion.epilogue == MG_GEMM_EPILOGUE_KV_APPEND &&
        mg_kv_cache_bytes(c->t.fusion.kv_cache, &pool_bytes) == MG_OK) { /* checked above */
        /* the pages are written too: they overlap none of the GEMM's operands */
        t[count++] = (mg_op_tensor){"k_pages", c->t.fusion.kv_append->k_pages, pool_bytes / 2, 16,
                                    MG_OP_OUT};
        t[count++] = (mg_op_tensor){"v_pages", c->t.fusion.kv_append->v_pages, pool_bytes / 2, 16,
                                    MG_OP_OUT};
    }
    if (c->t.workspace_bytes)
        t[count++] =
            (mg_op_tensor){"workspace", c->t.workspace, c->t.workspace_bytes, 16, MG_OP_OUT};
    if ((st = mg_op_check_tensors(b, what, t, count, residual_index < 0 ? -1 : 2, residual_index)))
        return st;
    /* the kernels that read the norm weight read it as they read act */
    c->plan.pointer_alignment =
        pointer_alignment(c->t.act | c->t.weight | c->t.out | (norm ? c->t.fusion.norm_weight : 0));
    return MG_OK;
}

/* ------------------------------------------------------------------ dispatch */

/* The provider of `plan`: the registry's choice, which for a fusion must be a provider that
 * declares it (its supports hook asks mg_gemm_fusion_declared; checked again here, so a hook
 * that forgot cannot run a fusion partly). `fn` names the entry point in messages; with a
 * fusion it is followed by the fusion's name. */
static mg_status choose(mg_backend *b, const mg_gemm_plan *plan, const char *fn,
                        const mg_op_provider **out) {
    char what[160];
    if (has_fusion(plan)) {
        char text[96];
        fusion_text(plan, text, sizeof text);
        snprintf(what, sizeof what, "%s with fusion %s", fn, text);
    } else {
        snprintf(what, sizeof what, "%s", fn);
    }
    mg_status st = mg_op_choose(b, op_of(plan->kind), plan, what, out);
    if (st)
        return st;
    char reason[160];
    if (!mg_gemm_fusion_declared((const mg_gemm_provider *)*out, plan, reason, sizeof reason))
        return MG_ERROR(MG_ERR_UNSUPPORTED, "%s: provider %s on the %s backend %s", what,
                        (*out)->name, mg_backend_kind_name(mg_backend_get_kind(b)), reason);
    return MG_OK;
}

/* The workspace a caller must supply to `p` on `b` (0: none). */
static size_t workspace_need(mg_backend *b, const mg_op_provider *p) {
    const mg_gemm_provider *g = (const mg_gemm_provider *)p;
    return g->workspace_bytes ? g->workspace_bytes(b) : 0;
}

static mg_status run_call(mg_backend *b, mg_stream *s, mg_gemm_call *c) {
    mg_status st = check_call(b, c);
    if (st)
        return st;
    const mg_op_provider *p;
    if ((st = choose(b, &c->plan, kind_name(c->plan.kind), &p)))
        return st;
    const char *what = kind_name(c->plan.kind);
    bool caller_workspace = c->t.workspace != 0;
    size_t need = workspace_need(b, p);
    if (caller_workspace && c->t.workspace_bytes < need) {
        char have[32], want[32];
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "%s: the caller's workspace has %s, provider %s needs %s "
                        "(mg_gemm_workspace_bytes)",
                        what, mg_format_bytes(c->t.workspace_bytes, have, sizeof have), p->name,
                        mg_format_bytes(need, want, sizeof want));
    }
    if ((st = ((const mg_gemm_provider *)p)->run(b, s, c)))
        return st;
    mg_op_count_call(b, op_of(c->plan.kind), p, caller_workspace);
    return MG_OK;
}

mg_status mg_gemm(mg_backend *b, mg_stream *s, const mg_gemm_plan *plan,
                  const mg_gemm_tensors *tensors) {
    if (!plan || !tensors)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "mg_gemm: NULL %s", plan ? "tensors" : "plan");
    mg_gemm_call c = {.plan = *plan, .t = *tensors};
    return run_call(b, s, &c);
}

mg_status mg_gemm_workspace_bytes(mg_backend *b, const mg_gemm_plan *plan, size_t *bytes) {
    const char *fn = "mg_gemm_workspace_bytes";
    mg_status st = mg_op_enter(b, fn);
    if (st)
        return st;
    if (!plan || !bytes)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: NULL %s", fn, plan ? "output" : "plan");
    if ((st = check_plan(plan)))
        return st;
    const mg_op_provider *p;
    if ((st = choose(b, plan, fn, &p)))
        return st;
    *bytes = workspace_need(b, p);
    return MG_OK;
}

mg_status mg_gemm_bf16(mg_backend *b, mg_stream *s, uint32_t m, uint32_t n, uint32_t k,
                       mg_devptr act, mg_devptr weight, mg_devptr out, mg_dtype out_type,
                       uint32_t ldc) {
    mg_gemm_call c = {
        .plan = {.kind = MG_GEMM_BF16, .m = m, .n = n, .k = k, .ldc = ldc, .out_type = out_type},
        .t = {.act = act, .weight = weight, .out = out}};
    return run_call(b, s, &c);
}

/* The block modes matter only to MG_GEMM_FP8_BLOCKSCALED; the per-tensor and per-row kinds
 * pass MG_FP8_BLOCK_1X128, the zero value their plans always held. */
static mg_status fp8_call(mg_gemm_kind kind, mg_backend *b, mg_stream *s, uint32_t m, uint32_t n,
                          uint32_t k, mg_devptr act, mg_devptr act_scale,
                          mg_fp8_block_scale act_mode, mg_devptr weight, mg_devptr weight_scale,
                          mg_fp8_block_scale weight_mode, mg_devptr out, uint32_t ldc) {
    mg_gemm_call c = {.plan = {.kind = kind,
                               .m = m,
                               .n = n,
                               .k = k,
                               .ldc = ldc,
                               .out_type = MG_DTYPE_BF16,
                               .act_mode = act_mode,
                               .weight_mode = weight_mode},
                      .t = {.act = act,
                            .weight = weight,
                            .out = out,
                            .act_scale = act_scale,
                            .weight_scale = weight_scale}};
    return run_call(b, s, &c);
}

mg_status mg_gemm_fp8_tensorwise(mg_backend *b, mg_stream *s, uint32_t m, uint32_t n, uint32_t k,
                                 mg_devptr act, mg_devptr act_scale, mg_devptr weight,
                                 mg_devptr weight_scale, mg_devptr out, uint32_t ldc) {
    return fp8_call(MG_GEMM_FP8_TENSORWISE, b, s, m, n, k, act, act_scale, MG_FP8_BLOCK_1X128,
                    weight, weight_scale, MG_FP8_BLOCK_1X128, out, ldc);
}

mg_status mg_gemm_fp8_rowwise(mg_backend *b, mg_stream *s, uint32_t m, uint32_t n, uint32_t k,
                              mg_devptr act, mg_devptr act_scale, mg_devptr weight,
                              mg_devptr weight_scale, mg_devptr out, uint32_t ldc) {
    return fp8_call(MG_GEMM_FP8_ROWWISE, b, s, m, n, k, act, act_scale, MG_FP8_BLOCK_1X128, weight,
                    weight_scale, MG_FP8_BLOCK_1X128, out, ldc);
}

mg_status mg_gemm_fp8_blockscaled(mg_backend *b, mg_stream *s, uint32_t m, uint32_t n, uint32_t k,
                                  mg_devptr act, mg_devptr act_scale, mg_fp8_block_scale act_mode,
                                  mg_devptr weight, mg_devptr weight_scale,
                                  mg_fp8_block_scale weight_mode, mg_devptr out, uint32_t ldc) {
    return fp8_call(MG_GEMM_FP8_BLOCKSCALED, b, s, m, n, k, act, act_scale, act_mode, weight,
                    weight_scale, weight_mode, out, ldc);
}

/* ------------------------------------------------------------------ scale transpose */

mg_status mg_fp8_act_scales_transpose(mg_backend *b, mg_stream *s, uint32_t m, uint32_t m_pad,
                                      uint32_t k, mg_devptr src, mg_devptr dst) {
    const char *what = "mg_fp8_act_scales_transpose";
    mg_status st = mg_op_enter(b, what);
    if (st)
        return st;
    if (m == 0 || k == 0)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: empty shape M=%u K=%u", what, m, k);
    if (m_pad < m || m_pad % 4)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: m_pad=%u must be >= M=%u and a multiple of 4",
                        what, m_pad, m);
    uint64_t blocks = mg_fp8_k_blocks(k);
    mg_op_tensor t[] = {
        {"src", src, blocks * m * 4, 4, MG_OP_IN}, /* < 2^62 */
        {"dst", dst, blocks * m_pad * 4, 4, MG_OP_OUT},
    };
    if ((st = mg_op_check_tensors(b, what, t, 2, -1, -1)))
        return st;
    /* The same kernel, with the same arguments, on every backend (CUDA:
     * kernels/cuda/gemm/fp8_scale_layout.cu; CPU: gemm_reference.c). */
    mg_dim3 grid, block;
    mg_launch_config_1d(blocks * m_pad, 256, &grid, &block);
    mg_launch l;
    mg_launch_init(&l, grid, block, 0);
    mg_launch_arg_ptr(&l, src);
    mg_launch_arg_ptr(&l, dst);
    mg_launch_arg_u32(&l, m);
    mg_launch_arg_u32(&l, m_pad);
    mg_launch_arg_u32(&l, (uint32_t)blocks);
    const char *kernel = "fp8_act_scales_transpose";
    return mg_op_launch_kernels(b, s, &kernel, &l, 1);
}

/* ------------------------------------------------------------------ planning and modes */

mg_status mg_gemm_prewarm(mg_backend *b, mg_stream *s, const mg_gemm_plan *plans, size_t count) {
    const char *fn = "mg_gemm_prewarm";
    mg_status st = mg_op_enter(b, fn);
    if (st)
        return st;
    if (count && !plans)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: NULL plans", fn);
    for (size_t i = 0; i < count; i++) {
        st = check_plan(&plans[i]);
        if (st) {
            mg_error_append(" (mg_gemm_prewarm: plan %zu)", i);
            return st;
        }
        uint32_t a = plans[i].pointer_alignment;
        if (a != 0 && a != 1 && a != 2 && a != 4 && a != 8 && a != 16)
            return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                            "mg_gemm_prewarm: plan %zu: pointer_alignment %u is not 0 or a power "
                            "of two <= 16",
                            i, a);
    }
    if ((st = mg_stream_check_not_capturing(b, s, fn)))
        return st;
    /* Each plan goes to the provider its calls will use. */
    for (size_t i = 0; i < count; i++) {
        const mg_op_provider *p;
        if ((st = choose(b, &plans[i], fn, &p))) {
            mg_error_append(" (plan %zu)", i);
            return st;
        }
        const mg_gemm_provider *g = (const mg_gemm_provider *)p;
        if (g->prewarm && (st = g->prewarm(b, s, &plans[i], 1))) {
            mg_error_append(" (plan %zu)", i);
            return st;
        }
    }
    return MG_OK;
}

/* Applies to every GEMM provider of the backend, so a forced provider honours it too. */
mg_status mg_gemm_set_batch_invariant(mg_backend *b, bool enabled) {
    mg_status st = mg_op_enter(b, "mg_gemm_set_batch_invariant");
    for (const mg_op_provider *const *p = gemm_providers; !st && *p; p++) {
        const mg_gemm_provider *g = (const mg_gemm_provider *)*p;
        if (g->set_batch_invariant &&
            mg_op_provider_available(b, MG_OP_GEMM_BF16, (*p)->name, NULL, 0))
            st = g->set_batch_invariant(b, enabled);
    }
    return st;
}

bool mg_gemm_batch_invariant(mg_backend *b) {
    if (!mg_backend_is_live(b)) /* a query: no error for a dead handle */
        return false;
    for (const mg_op_provider *const *p = gemm_providers; *p; p++) {
        const mg_gemm_provider *g = (const mg_gemm_provider *)*p;
        if (g->batch_invariant &&
            mg_op_provider_available(b, MG_OP_GEMM_BF16, (*p)->name, NULL, 0) &&
            !g->batch_invariant(b))
            return false;
    }
    return true;
}
