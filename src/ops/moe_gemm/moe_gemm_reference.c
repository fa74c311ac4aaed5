/* moe_gemm_reference.c - the reference grouped MoE GEMM (metrale/ops_moe_gemm.h) on the CPU
 * backend: the CPU kernel "moe_gemm_ref" (stream-ordered and capturable like a GPU launch, every
 * buffer range checked against the live allocations when it runs), built on the GEMM op's
 * reference loops and the FP8 quantizer's rule, so the three share one definition:
 *
 *   per expert: its activation rows gathered; for FP8 quantized like mg_fp8_quantize_rowwise /
 *   _1x128; the dense reference (mg_gemm_bf16_cpu / mg_gemm_fp8_cpu: FP32 accumulation, FP8
 *   block scales applied per 128-wide partial sum); BF16 out, or in the gate_up form a BF16
 *   [rows, 2n] intermediate then mg_silu_mul_reference_one.
 *
 * Unlike the CUDA kernels (which clamp), it checks the routing: bad offsets or token ids are
 * MG_ERR_INVALID_ARGUMENT from the launch. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_kernels.h"
#include "error.h"
#include "fp8_quantize_host.h"
#include "gemm_host.h"
#include "metrale/launch.h"
#include "metrale/ops_gemm.h"
#include "moe_gemm_provider.h"
#include "moe_routing_host.h"
#include "op_builtin.h"
#include "silu_mul_host.h"

#define KERNEL_FUNCTION "moe_gemm_ref"
#define KERNEL_NAME "metrale:" KERNEL_FUNCTION

/* Launch arguments of the kernel. */
enum {
    ARG_ACT,
    ARG_TOKEN_IDS,
    ARG_OFFSETS,
    ARG_WEIGHT,
    ARG_WEIGHT_SCALE,
    ARG_OUT,
    ARG_KIND,
    ARG_GATE_UP,
    ARG_EXPERTS,
    ARG_ROWS,
    ARG_ACT_ROWS,
    ARG_N,
    ARG_K,
    ARG_ACT_PITCH,
    ARG_LDC,
    ARG_COUNT
};

typedef struct ref_call {
    mg_moe_gemm_kind kind;
    bool gate_up;
    uint32_t experts, rows, act_rows, n, n_w, k, act_pitch, ldc;
    const uint16_t *act;
    const int32_t *token_ids, *offsets;
    const uint8_t *weight;
    const float *weight_scale;
    uint16_t *out;
} ref_call;

/* Host scratch for one expert of up to `rows` rows. */
typedef struct scratch {
    uint16_t *act;     /* gathered BF16 [rows, k] */
    uint16_t *product; /* BF16 [rows, n_w] (gate_up only) */
    uint8_t *codes;    /* E4M3 [rows, k] (FP8) */
    float *act_scales; /* [rows * L] (FP8) */
    float *w_scales;   /* one expert's weight scales in the GEMM reference's layout (FP8) */
} scratch;

static void scratch_free(scratch *s) {
    free(s->act);
    free(s->product);
    free(s->codes);
    free(s->act_scales);
    free(s->w_scales);
}

static mg_status scratch_alloc(scratch *s, const ref_call *c, uint32_t rows) {
    bool fp8 = c->kind != MG_MOE_GEMM_BF16;
    size_t blocks = mg_fp8_k_blocks(c->k);
    s->act = malloc((size_t)rows * c->k * 2);
    s->product = c->gate_up ? malloc((size_t)rows * c->n_w * 2) : NULL;
    s->codes = fp8 ? malloc((size_t)rows * c->k) : NULL;
    s->act_scales = fp8 ? malloc((size_t)rows * blocks * 4) : NULL;
    s->w_scales = fp8 ? malloc(mg_fp8_block_scale_count(MG_FP8_BLOCK_128X128, c->n_w, c->k) * 4 +
                               (size_t)c->n_w * 4)
                      : NULL;
    if (!s->act || (c->gate_up && !s->product) ||
        (fp8 && (!s->codes || !s->act_scales || !s->w_scales))) {
        scratch_free(s);
        return MG_ERROR(MG_ERR_OUT_OF_MEMORY, "cpu kernel %s: no host memory for %u rows",
                        KERNEL_NAME, rows);
    }
    return MG_OK;
}

/* Expert e's product of its `rows` gathered rows (s->act) into dst (row pitch ld). */
static void expert_product(const ref_call *c, scratch *s, uint32_t e, uint32_t rows, uint16_t *dst,
                           uint32_t ld) {
    size_t weight_elems = (size_t)c->n_w * c->k;
    if (c->kind == MG_MOE_GEMM_BF16) {
        mg_gemm_bf16_cpu(rows, c->n_w, c->k, s->act, (const uint16_t *)c->weight + e * weight_elems,
                         dst, MG_DTYPE_BF16, ld);
        return;
    }
    bool blocks = c->kind == MG_MOE_GEMM_FP8_BLOCKSCALED;
    uint32_t kb = mg_fp8_k_blocks(c->k);
    /* The activation quantized as mg_fp8_quantize_rowwise / _1x128 would (the 1x128 scales in
     * the GEMM reference's [L, rows] layout). */
    mg_fp8_quantize_tiles(s->act, c->k, rows, c->k, s->codes, s->act_scales,
                          blocks ? (mg_fp8_tiling){1, MG_FP8_SCALE_BLOCK, 1, rows}
                                 : (mg_fp8_tiling){1, c->k, 1, 0});
    const float *w_scales;
    if (blocks) {
        /* [ceil(n_w / 128), L] here, the padded GEMM layout there. */
        uint32_t row_blocks = (c->n_w + MG_FP8_SCALE_BLOCK - 1) / MG_FP8_SCALE_BLOCK;
        const float *src = c->weight_scale + (size_t)e * row_blocks * kb;
        for (uint32_t rb = 0; rb < row_blocks; rb++)
            for (uint32_t g = 0; g < kb; g++)
                s->w_scales[mg_fp8_block_scale_index(MG_FP8_BLOCK_128X128, c->n_w, c->k,
                                                     rb * MG_FP8_SCALE_BLOCK, g)] =
                    src[(size_t)rb * kb + g];
        w_scales = s->w_scales;
    } else {
        w_scales = c->weight_scale + (size_t)e * c->n_w;
    }
    mg_gemm_fp8_cpu(rows, c->n_w, c->k,
                    (mg_fp8_operand_host){s->codes, s->act_scales,
                                          blocks ? MG_FP8_SCALING_1X128 : MG_FP8_SCALING_ROW},
                    (mg_fp8_operand_host){c->weight + e * weight_elems, w_scales,
                                          blocks ? MG_FP8_SCALING_128X128 : MG_FP8_SCALING_ROW},
                    dst, ld);
}

static mg_status run_reference(const ref_call *c) {
    mg_status st = mg_moe_routing_check_host(KERNEL_NAME, c->offsets, c->experts, c->rows, false,
                                             c->token_ids, c->act_rows);
    if (st)
        return st;
    uint32_t most = 0;
    for (uint32_t e = 0; e < c->experts; e++) {
        uint32_t count = (uint32_t)(c->offsets[e + 1] - c->offsets[e]);
        most = count > most ? count : most;
    }
    if (!most)
        return MG_OK;
    scratch s = {0};
    if ((st = scratch_alloc(&s, c, most)))
        return st;
    for (uint32_t e = 0; e < c->experts; e++) {
        uint32_t begin = (uint32_t)c->offsets[e], rows = (uint32_t)c->offsets[e + 1] - begin;
        if (!rows)
            continue;
        for (uint32_t r = 0; r < rows; r++) {
            uint32_t src = c->token_ids ? (uint32_t)c->token_ids[begin + r] : begin + r;
            memcpy(s.act + (size_t)r * c->k, c->act + (size_t)src * c->act_pitch, (size_t)c->k * 2);
        }
        uint16_t *out = c->out + (size_t)begin * c->ldc;
        if (!c->gate_up) {
            expert_product(c, &s, e, rows, out, c->ldc);
            continue;
        }
        expert_product(c, &s, e, rows, s.product, c->n_w);
        for (uint32_t r = 0; r < rows; r++)
            for (uint32_t j = 0; j < c->n; j++)
                out[(size_t)r * c->ldc + j] = mg_silu_mul_reference_one(
                    s.product[(size_t)r * c->n_w + j], s.product[(size_t)r * c->n_w + c->n + j]);
    }
    scratch_free(&s);
    return MG_OK;
}

static mg_status kernel_moe_gemm(const mg_launch *l) {
    static const mg_arg_kind kinds[ARG_COUNT] = {
        MG_ARG_BUFFER, MG_ARG_BUFFER, MG_ARG_BUFFER, MG_ARG_BUFFER, MG_ARG_BUFFER,
        MG_ARG_BUFFER, MG_ARG_U32,    MG_ARG_U32,    MG_ARG_U32,    MG_ARG_U32,
        MG_ARG_U32,    MG_ARG_U32,    MG_ARG_U32,    MG_ARG_U32,    MG_ARG_U32};
    mg_status st = mg_cpu_kernel_check_args(l, KERNEL_NAME, kinds, ARG_COUNT);
    if (st)
        return st;
    ref_call c = {.kind = (mg_moe_gemm_kind)mg_launch_get_u32(l, ARG_KIND),
                  .gate_up = mg_launch_get_u32(l, ARG_GATE_UP) != 0,
                  .experts = mg_launch_get_u32(l, ARG_EXPERTS),
                  .rows = mg_launch_get_u32(l, ARG_ROWS),
                  .act_rows = mg_launch_get_u32(l, ARG_ACT_ROWS),
                  .n = mg_launch_get_u32(l, ARG_N),
                  .k = mg_launch_get_u32(l, ARG_K),
                  .act_pitch = mg_launch_get_u32(l, ARG_ACT_PITCH),
                  .ldc = mg_launch_get_u32(l, ARG_LDC)};
    c.n_w = c.gate_up ? 2 * c.n : c.n;
    bool fp8 = c.kind != MG_MOE_GEMM_BF16;
    uint64_t per_expert_scales = c.kind == MG_MOE_GEMM_FP8_ROWWISE
                                     ? c.n_w
                                     : (uint64_t)((c.n_w + 127) / 128) * mg_fp8_k_blocks(c.k);
    uint64_t weight_bytes = (uint64_t)c.experts * c.n_w * c.k * (fp8 ? 1 : 2);
    void *p[ARG_OUT + 1] = {0};
    if ((st = mg_cpu_kernel_buffer(l, ARG_ACT, ((uint64_t)(c.act_rows - 1) * c.act_pitch + c.k) * 2,
                                   16, KERNEL_NAME, &p[ARG_ACT])) ||
        (mg_launch_get_ptr(l, ARG_TOKEN_IDS) &&
         (st = mg_cpu_kernel_buffer(l, ARG_TOKEN_IDS, (uint64_t)c.rows * 4, 4, KERNEL_NAME,
                                    &p[ARG_TOKEN_IDS]))) ||
        (st = mg_cpu_kernel_buffer(l, ARG_OFFSETS, ((uint64_t)c.experts + 1) * 4, 4, KERNEL_NAME,
                                   &p[ARG_OFFSETS])) ||
        (st = mg_cpu_kernel_buffer(l, ARG_WEIGHT, weight_bytes, 16, KERNEL_NAME, &p[ARG_WEIGHT])) ||
        (fp8 && (st = mg_cpu_kernel_buffer(l, ARG_WEIGHT_SCALE, per_expert_scales * c.experts * 4,
                                           4, KERNEL_NAME, &p[ARG_WEIGHT_SCALE]))) ||
        (st = mg_cpu_kernel_buffer(l, ARG_OUT, ((uint64_t)(c.rows - 1) * c.ldc + c.n) * 2, 2,
                                   KERNEL_NAME, &p[ARG_OUT])))
        return st;
    c.act = p[ARG_ACT];
    c.token_ids = p[ARG_TOKEN_IDS];
    c.offsets = p[ARG_OFFSETS];
    c.weight = p[ARG_WEIGHT];
    c.weight_scale = p[ARG_WEIGHT_SCALE];
    c.out = p[ARG_OUT];
    return run_reference(&c);
}

static void register_kernels(void) {
    mg_cpu_kernel_register("metrale", KERNEL_FUNCTION, kernel_moe_gemm);
}

static mg_status reference_run(mg_backend *b, mg_stream *s, const mg_moe_gemm_call *c) {
    const mg_moe_gemm_desc *d = &c->d;
    mg_launch l;
    mg_launch_init(&l, (mg_dim3){1, 1, 1}, (mg_dim3){1, 1, 1}, 0);
    mg_launch_arg_ptr(&l, c->t.act);
    mg_launch_arg_ptr(&l, c->t.sorted_token_ids);
    mg_launch_arg_ptr(&l, c->t.expert_offsets);
    mg_launch_arg_ptr(&l, c->t.weight);
    mg_launch_arg_ptr(&l, c->t.weight_scale);
    mg_launch_arg_ptr(&l, c->t.out);
    mg_launch_arg_u32(&l, (uint32_t)d->kind);
    mg_launch_arg_u32(&l, d->gate_up);
    mg_launch_arg_u32(&l, d->experts);
    mg_launch_arg_u32(&l, d->rows);
    mg_launch_arg_u32(&l, d->act_rows);
    mg_launch_arg_u32(&l, d->n);
    mg_launch_arg_u32(&l, d->k);
    mg_launch_arg_u32(&l, d->act_pitch);
    mg_launch_arg_u32(&l, d->ldc);
    const char *kernel = KERNEL_FUNCTION;
    return mg_op_launch_kernels(b, s, &kernel, &l, 1);
}

/* Every call the front accepts, no workspace. */
const mg_moe_gemm_provider mg_moe_gemm_reference_provider = {
    .base = {.name = "reference",
             .backend = MG_BACKEND_CPU,
             .register_cpu_kernels = register_kernels},
    .run = reference_run,
};
