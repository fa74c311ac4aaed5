/* gemm_reference.c - the FP8 scale transpose on host memory, the CPU kernels of the GEMM ops
 * (gemm_reference.h) over the reference GEMMs (gemm_host.h), and the provider that runs them on
 * the CPU backend. */
#include "gemm_reference.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "checked_math.h"
#include "cpu_kernels.h"
#include "elementwise_host.h"
#include "error.h"
#include "gemm_provider.h"
#include "metrale/launch.h"
#include "op_builtin.h"
#include "silu_mul_host.h"

void mg_fp8_act_scales_transpose_cpu(uint32_t m, uint32_t m_pad, uint32_t k, const float *src,
                                     float *dst) {
    uint32_t blocks = mg_fp8_k_blocks(k);
    for (uint32_t g = 0; g < blocks; g++) {
        for (uint32_t t = 0; t < m; t++)
            dst[(size_t)g * m_pad + t] = src[(size_t)t * blocks + g];
        memset(dst + (size_t)g * m_pad + m, 0, (size_t)(m_pad - m) * sizeof(float));
    }
}

/* ------------------------------------------------------------------ CPU kernels */

/* Bytes an FP8 operand's scales occupy under `scaling` (rows: M or N). */
static uint64_t scale_bytes(mg_fp8_scaling scaling, uint32_t rows, uint32_t k) {
    switch (scaling) {
    case MG_FP8_SCALING_TENSOR:
        return 4;
    case MG_FP8_SCALING_ROW:
        return (uint64_t)rows * 4;
    case MG_FP8_SCALING_1X128:
        return mg_fp8_block_scale_count(MG_FP8_BLOCK_1X128, rows, k) * 4;
    case MG_FP8_SCALING_128X128:
        return mg_fp8_block_scale_count(MG_FP8_BLOCK_128X128, rows, k) * 4;
    }
    return 0;
}

/* Bytes from the first element of a row-major matrix to one past the last: (m - 1) * ldc + n
 * elements; UINT64_MAX (which no buffer holds) when that overflows. */
static uint64_t matrix_span(uint32_t m, uint32_t n, uint32_t ldc, uint64_t element_bytes) {
    size_t span;
    return mg_matrix_span_bytes(m, n, ldc, element_bytes, &span) ? span : UINT64_MAX;
}

mg_status mg_gemm_bf16_cpu_args_get(const mg_launch *l, const char *name,
                                    mg_gemm_bf16_cpu_args *a) {
    static const mg_arg_kind kinds[] = {MG_ARG_BUFFER, MG_ARG_BUFFER, MG_ARG_BUFFER, MG_ARG_U32,
                                        MG_ARG_U32,    MG_ARG_U32,    MG_ARG_U32,    MG_ARG_U32};
    mg_status st = mg_cpu_kernel_check_args(l, name, kinds, 8);
    if (st)
        return st;
    a->m = mg_launch_get_u32(l, 3);
    a->n = mg_launch_get_u32(l, 4);
    a->k = mg_launch_get_u32(l, 5);
    a->ldc = mg_launch_get_u32(l, 6);
    a->out_type = (mg_dtype)mg_launch_get_u32(l, 7);
    /* The output is stored as f32 or else as bf16: any other type would be written with an
     * element size its buffer was not checked for. */
    if (a->out_type != MG_DTYPE_F32 && a->out_type != MG_DTYPE_BF16)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "cpu kernel %s: output type %u, expected bf16 or f32", name,
                        (unsigned)a->out_type);
    const uint32_t out_bytes = (uint32_t)mg_dtype_bytes(a->out_type);
    void *act, *weight, *out;
    if ((st = mg_cpu_kernel_buffer(l, 0, matrix_span(a->m, a->k, a->k, 2), 2, name, &act)) ||
        (st = mg_cpu_kernel_buffer(l, 1, matrix_span(a->n, a->k, a->k, 2), 2, name, &weight)) ||
        (st = mg_cpu_kernel_buffer(l, 2, matrix_span(a->m, a->n, a->ldc, out_bytes), out_bytes,
                                   name, &out)))
        return st;
    a->act = act;
    a->weight = weight;
    a->out = out;
    return MG_OK;
}

static mg_status run_gemm_bf16(const mg_launch *l, const char *name) {
    mg_gemm_bf16_cpu_args a;
    mg_status st = mg_gemm_bf16_cpu_args_get(l, name, &a);
    if (!st)
        mg_gemm_bf16_cpu(a.m, a.n, a.k, a.act, a.weight, a.out, a.out_type, a.ldc);
    return st;
}

static mg_status kernel_gemm_bf16(const mg_launch *l) {
    return run_gemm_bf16(l, "metrale:gemm_bf16_ref");
}

/* The same reference under the name every device backend's BF16 GEMM kernel has
 * (gemm_kernels.c): what the Metal test double runs for the MSL kernel gemm_bf16. */
static mg_status kernel_gemm_bf16_device(const mg_launch *l) {
    return run_gemm_bf16(l, "metrale:" MG_GEMM_BF16_KERNEL);
}

static mg_status kernel_gemm_fp8(const mg_launch *l) {
    static const char name[] = "metrale:gemm_fp8_ref";
    static const mg_arg_kind kinds[] = {MG_ARG_BUFFER, MG_ARG_BUFFER, MG_ARG_BUFFER, MG_ARG_BUFFER,
                                        MG_ARG_BUFFER, MG_ARG_U32,    MG_ARG_U32,    MG_ARG_U32,
                                        MG_ARG_U32,    MG_ARG_U32,    MG_ARG_U32};
    mg_status st = mg_cpu_kernel_check_args(l, name, kinds, 11);
    if (st)
        return st;
    uint32_t m = mg_launch_get_u32(l, 5), n = mg_launch_get_u32(l, 6), k = mg_launch_get_u32(l, 7);
    uint32_t ldc = mg_launch_get_u32(l, 8);
    mg_fp8_scaling act_scaling = (mg_fp8_scaling)mg_launch_get_u32(l, 9);
    mg_fp8_scaling weight_scaling = (mg_fp8_scaling)mg_launch_get_u32(l, 10);
    if ((unsigned)act_scaling > MG_FP8_SCALING_128X128 ||
        (unsigned)weight_scaling > MG_FP8_SCALING_128X128)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "cpu kernel %s: unknown scaling (act %u, weight %u)", name,
                        (unsigned)act_scaling, (unsigned)weight_scaling);
    void *act, *act_scale, *weight, *weight_scale, *out;
    if ((st = mg_cpu_kernel_buffer(l, 0, matrix_span(m, k, k, 1), 16, name, &act)) ||
        (st = mg_cpu_kernel_buffer(l, 1, scale_bytes(act_scaling, m, k), 4, name, &act_scale)) ||
        (st = mg_cpu_kernel_buffer(l, 2, matrix_span(n, k, k, 1), 16, name, &weight)) ||
        (st = mg_cpu_kernel_buffer(l, 3, scale_bytes(weight_scaling, n, k), 4, name,
                                   &weight_scale)) ||
        (st = mg_cpu_kernel_buffer(l, 4, matrix_span(m, n, ldc, 2), 16, name, &out)))
        return st;
    mg_gemm_fp8_cpu(m, n, k, (mg_fp8_operand_host){act, act_scale, act_scaling},
                    (mg_fp8_operand_host){weight, weight_scale, weight_scaling}, out, ldc);
    return MG_OK;
}

static mg_status kernel_act_scales_transpose(const mg_launch *l) {
    static const char name[] = "metrale:fp8_act_scales_transpose";
    static const mg_arg_kind kinds[] = {MG_ARG_BUFFER, MG_ARG_BUFFER, MG_ARG_U32, MG_ARG_U32,
                                        MG_ARG_U32};
    mg_status st = mg_cpu_kernel_check_args(l, name, kinds, 5);
    if (st)
        return st;
    uint32_t m = mg_launch_get_u32(l, 2), m_pad = mg_launch_get_u32(l, 3);
    uint32_t blocks = mg_launch_get_u32(l, 4);
    /* Each block's rows [m, m_pad) are zero-filled: fewer padded rows than rows would write
     * past the block (and the fill's length would wrap). */
    if (m_pad < m)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "cpu kernel %s: m_pad %u is less than m %u", name,
                        m_pad, m);
    void *src, *dst;
    if ((st = mg_cpu_kernel_buffer(l, 0, (uint64_t)m * blocks * 4, 4, name, &src)) ||
        (st = mg_cpu_kernel_buffer(l, 1, (uint64_t)m_pad * blocks * 4, 4, name, &dst)))
        return st;
    /* Any K with this many blocks gives the same layout. */
    mg_fp8_act_scales_transpose_cpu(m, m_pad, blocks * MG_FP8_SCALE_BLOCK, src, dst);
    return MG_OK;
}

/* ------------------------------------------------------------------ the fused GEMM
 *
 * A fused GEMM (metrale/ops_gemm.h, "fusion") is, by definition, the composition of the unfused
 * reference ops: the RMSNorm kernel's body, the FP8 row quantizer, the GEMM above, the SiLU-mul
 * reference and the argmax kernel's body, each rounding as it does alone. Scratch for the
 * intermediates is host memory of this kernel (it runs on the host, at enqueue or at replay). */

/* An optional buffer argument (0 allowed): NULL when it is 0. */
static mg_status optional_buffer(const mg_launch *l, uint32_t index, uint64_t bytes,
                                 uint32_t alignment, const char *name, void **out) {
    *out = NULL;
    if (!mg_launch_get_ptr(l, index))
        return MG_OK;
    return mg_cpu_kernel_buffer(l, index, bytes, alignment, name, out);
}

typedef struct gemm_fused_args {
    mg_gemm_kind kind; /* MG_GEMM_BF16 or MG_GEMM_FP8_ROWWISE */
    uint32_t m, n, k, ldc;
    mg_dtype out_type;
    mg_gemm_prologue prologue;
    mg_gemm_epilogue epilogue;
    float eps;
    const void *act;
    const float *act_scale; /* FP8 without the prologue */
    const void *weight;
    const float *weight_scale; /* FP8 */
    void *out;
    const uint16_t *norm_weight, *residual;
    int32_t *argmax_ids;
} gemm_fused_args;

/* The GEMM's input rows: act itself, or RMSNorm(act) (FP8: quantized by rows, its scales in
 * *scales). *scratch is what to free. */
static mg_status fused_input(const gemm_fused_args *a, const void **x, const float **scales,
                             void **scratch) {
    *x = a->act;
    *scales = a->act_scale;
    *scratch = NULL;
    if (a->prologue != MG_GEMM_PROLOGUE_RMSNORM)
        return MG_OK;
    size_t elements = (size_t)a->m * a->k;
    bool fp8 = a->kind != MG_GEMM_BF16;
    /* normed BF16, then (FP8) codes and one scale per row */
    size_t bytes = elements * 2 + (fp8 ? elements + (size_t)a->m * 4 + 16 : 0);
    uint16_t *copy = malloc(elements * 2), *normed = malloc(bytes);
    if (!copy || !normed) {
        free(copy);
        free(normed);
        return MG_ERROR(MG_ERR_OUT_OF_MEMORY, "metrale:gemm_fused_ref: no host scratch");
    }
    /* the op reads act and never writes it: the kernel body's in-place add is not used, but
     * it takes a writable x */
    memcpy(copy, a->act, elements * 2);
    mg_rmsnorm_bf16_host(a->m, a->k, a->eps, copy, NULL, a->norm_weight, normed);
    free(copy);
    *x = normed;
    *scratch = normed;
    if (fp8) {
        float *row_scales = (float *)((char *)normed + elements * 2);
        uint8_t *codes = (uint8_t *)(row_scales + a->m);
        mg_status st = mg_fp8_quantize_rowwise(normed, a->m, a->k, codes, row_scales);
        if (st)
            return st;
        *x = codes;
        *scales = row_scales;
    }
    return MG_OK;
}

/* y = x · weightᵀ into `y` (row pitch ldy, type out_type; BF16 for FP8). */
static void fused_product(const gemm_fused_args *a, const void *x, const float *x_scales, void *y,
                          uint32_t ldy) {
    if (a->kind == MG_GEMM_BF16)
        mg_gemm_bf16_cpu(a->m, a->n, a->k, x, a->weight, y, a->out_type, ldy);
    else
        mg_gemm_fp8_cpu(a->m, a->n, a->k, (mg_fp8_operand_host){x, x_scales, MG_FP8_SCALING_ROW},
                        (mg_fp8_operand_host){a->weight, a->weight_scale, MG_FP8_SCALING_ROW}, y,
                        ldy);
}

static mg_status gemm_fused(const gemm_fused_args *a) {
    const void *x;
    const float *x_scales;
    void *scratch;
    mg_status st = fused_input(a, &x, &x_scales, &scratch);
    if (st) {
        free(scratch);
        return st;
    }
    uint16_t *y = NULL; /* the BF16 product [m, n], packed, where the epilogue needs it apart */
    if (a->epilogue == MG_GEMM_EPILOGUE_SILU_MUL || a->epilogue == MG_GEMM_EPILOGUE_RESIDUAL_ADD) {
        if (!(y = malloc((size_t)a->m * a->n * 2))) {
            free(scratch);
            return MG_ERROR(MG_ERR_OUT_OF_MEMORY, "metrale:gemm_fused_ref: no host scratch");
        }
        fused_product(a, x, x_scales, y, a->n);
    } else {
        fused_product(a, x, x_scales, a->out, a->ldc);
    }
    uint16_t *out = a->out;
    uint32_t half = a->n / 2;
    for (uint32_t t = 0; t < a->m && y; t++) {
        const uint16_t *yr = y + (size_t)t * a->n;
        uint16_t *o = out + (size_t)t * a->ldc;
        if (a->epilogue == MG_GEMM_EPILOGUE_SILU_MUL) {
            for (uint32_t j = 0; j < half; j++)
                o[j] = mg_silu_mul_reference_one(yr[j], yr[half + j]);
        } else { /* residual add, rounded as mg_rmsnorm_bf16's and mg_gather_rows_bf16's add */
            const uint16_t *r = a->residual + (size_t)t * a->ldc;
            for (uint32_t j = 0; j < a->n; j++)
                o[j] = mg_f32_to_bf16(mg_bf16_to_f32(yr[j]) + mg_bf16_to_f32(r[j]));
        }
    }
    if (a->epilogue == MG_GEMM_EPILOGUE_ARGMAX)
        mg_argmax_host(a->m, a->n, a->out, a->ldc, (unsigned)mg_dtype_bytes(a->out_type),
                       a->argmax_ids);
    free(y);
    free(scratch);
    return MG_OK;
}

static mg_status kernel_gemm_fused(const mg_launch *l) {
    static const char name[] = "metrale:gemm_fused_ref";
    static const mg_arg_kind kinds[] = {
        MG_ARG_BUFFER, MG_ARG_BUFFER, MG_ARG_BUFFER, MG_ARG_BUFFER, MG_ARG_BUFFER, MG_ARG_BUFFER,
        MG_ARG_BUFFER, MG_ARG_BUFFER, MG_ARG_U32,    MG_ARG_U32,    MG_ARG_U32,    MG_ARG_U32,
        MG_ARG_U32,    MG_ARG_U32,    MG_ARG_U32,    MG_ARG_U32,    MG_ARG_F32};
    mg_status st = mg_cpu_kernel_check_args(l, name, kinds, 17);
    if (st)
        return st;
    gemm_fused_args a = {.kind = (mg_gemm_kind)mg_launch_get_u32(l, 8),
                         .m = mg_launch_get_u32(l, 9),
                         .n = mg_launch_get_u32(l, 10),
                         .k = mg_launch_get_u32(l, 11),
                         .ldc = mg_launch_get_u32(l, 12),
                         .out_type = (mg_dtype)mg_launch_get_u32(l, 13),
                         .prologue = (mg_gemm_prologue)mg_launch_get_u32(l, 14),
                         .epilogue = (mg_gemm_epilogue)mg_launch_get_u32(l, 15),
                         .eps = mg_launch_get_f32(l, 16)};
    bool fp8 = a.kind == MG_GEMM_FP8_ROWWISE, norm = a.prologue == MG_GEMM_PROLOGUE_RMSNORM;
    bool silu = a.epilogue == MG_GEMM_EPILOGUE_SILU_MUL;
    /* Every value the body trusts: a bad launch is an error naming the kernel. */
    if ((a.kind != MG_GEMM_BF16 && !fp8) || (unsigned)a.prologue >= MG_GEMM_PROLOGUE_COUNT ||
        (unsigned)a.epilogue >= MG_GEMM_EPILOGUE_COUNT || !a.m || !a.n || !a.k ||
        (silu && a.n % 2) || a.ldc < (silu ? a.n / 2 : a.n) ||
        (a.out_type != MG_DTYPE_BF16 && (fp8 || a.out_type != MG_DTYPE_F32 ||
                                         a.epilogue == MG_GEMM_EPILOGUE_RESIDUAL_ADD || silu)))
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "cpu kernel %s: bad arguments (kind %u, M=%u N=%u K=%u ldc=%u, out type "
                        "%u, prologue %u, epilogue %u)",
                        name, (unsigned)a.kind, a.m, a.n, a.k, a.ldc, (unsigned)a.out_type,
                        (unsigned)a.prologue, (unsigned)a.epilogue);
    uint32_t in_bytes = norm ? 2 : fp8 ? 1 : 2, out_bytes = (uint32_t)mg_dtype_bytes(a.out_type);
    void *act, *act_scale, *weight, *weight_scale, *out, *norm_weight, *residual, *ids;
    if ((st = mg_cpu_kernel_buffer(l, 0, matrix_span(a.m, a.k, a.k, in_bytes), in_bytes, name,
                                   &act)) ||
        (st = optional_buffer(l, 1, (uint64_t)a.m * 4, 4, name, &act_scale)) ||
        (st = mg_cpu_kernel_buffer(l, 2, matrix_span(a.n, a.k, a.k, fp8 ? 1 : 2), fp8 ? 1 : 2, name,
                                   &weight)) ||
        (st = optional_buffer(l, 3, (uint64_t)a.n * 4, 4, name, &weight_scale)) ||
        (st = mg_cpu_kernel_buffer(l, 4, matrix_span(a.m, silu ? a.n / 2 : a.n, a.ldc, out_bytes),
                                   out_bytes, name, &out)) ||
        (st = optional_buffer(l, 5, (uint64_t)a.k * 2, 2, name, &norm_weight)) ||
        (st = optional_buffer(l, 6, matrix_span(a.m, a.n, a.ldc, 2), 2, name, &residual)) ||
        (st = optional_buffer(l, 7, (uint64_t)a.m * 4, 4, name, &ids)))
        return st;
    if ((fp8 && !weight_scale) || (fp8 && !norm && !act_scale) || (norm && !norm_weight) ||
        (a.epilogue == MG_GEMM_EPILOGUE_RESIDUAL_ADD && !residual) ||
        (a.epilogue == MG_GEMM_EPILOGUE_ARGMAX && !ids))
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "cpu kernel %s: a buffer the fusion reads is 0",
                        name);
    a.act = act;
    a.act_scale = act_scale;
    a.weight = weight;
    a.weight_scale = weight_scale;
    a.out = out;
    a.norm_weight = norm_weight;
    a.residual = residual;
    a.argmax_ids = ids;
    return gemm_fused(&a);
}

static void register_kernels(void) {
    /* Failure is out of host memory at start-up; the lookups then report NOT_FOUND. */
    mg_cpu_kernel_register("metrale", "gemm_bf16_ref", kernel_gemm_bf16);
    mg_cpu_kernel_register("metrale", MG_GEMM_BF16_KERNEL, kernel_gemm_bf16_device);
    mg_cpu_kernel_register("metrale", "gemm_fp8_ref", kernel_gemm_fp8);
    mg_cpu_kernel_register("metrale", "gemm_fused_ref", kernel_gemm_fused);
    mg_cpu_kernel_register("metrale", "fp8_act_scales_transpose", kernel_act_scales_transpose);
}

void mg_gemm_reference_kernels_register(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, register_kernels);
}

/* ------------------------------------------------------------------ the provider */

static mg_fp8_scaling scaling_of(const mg_gemm_plan *p, bool is_act) {
    if (p->kind == MG_GEMM_FP8_TENSORWISE)
        return MG_FP8_SCALING_TENSOR;
    if (p->kind == MG_GEMM_FP8_ROWWISE)
        return MG_FP8_SCALING_ROW;
    return (is_act ? p->act_mode : p->weight_mode) == MG_FP8_BLOCK_1X128 ? MG_FP8_SCALING_1X128
                                                                         : MG_FP8_SCALING_128X128;
}

mg_status mg_gemm_bf16_launch(mg_backend *b, mg_stream *s, const mg_gemm_call *c,
                              const char *kernel, mg_dim3 grid, mg_dim3 block) {
    const mg_gemm_plan *p = &c->plan;
    mg_launch l;
    mg_launch_init(&l, grid, block, 0);
    mg_launch_arg_ptr(&l, c->t.act);
    mg_launch_arg_ptr(&l, c->t.weight);
    mg_launch_arg_ptr(&l, c->t.out);
    mg_launch_arg_u32(&l, p->m);
    mg_launch_arg_u32(&l, p->n);
    mg_launch_arg_u32(&l, p->k);
    mg_launch_arg_u32(&l, p->ldc);
    mg_launch_arg_u32(&l, (uint32_t)p->out_type);
    return mg_op_launch_kernels(b, s, &kernel, &l, 1);
}

/* The provider runs the reference as a CPU kernel (gemm_reference.h): stream-ordered, capturable,
 * every buffer range checked against the live allocations when it runs. */
mg_status mg_gemm_bf16_cpu_launch(mg_backend *b, mg_stream *s, const mg_gemm_call *c,
                                  const char *kernel) {
    return mg_gemm_bf16_launch(b, s, c, kernel, (mg_dim3){1, 1, 1}, (mg_dim3){1, 1, 1});
}

/* The fused call: one CPU kernel, gemm_fused_ref (argument list in gemm_reference.h). */
static mg_status fused_run(mg_backend *b, mg_stream *s, const mg_gemm_call *c) {
    const mg_gemm_plan *p = &c->plan;
    mg_launch l;
    mg_launch_init(&l, (mg_dim3){1, 1, 1}, (mg_dim3){1, 1, 1}, 0);
    mg_launch_arg_ptr(&l, c->t.act);
    mg_launch_arg_ptr(&l, c->t.act_scale);
    mg_launch_arg_ptr(&l, c->t.weight);
    mg_launch_arg_ptr(&l, c->t.weight_scale);
    mg_launch_arg_ptr(&l, c->t.out);
    mg_launch_arg_ptr(&l, c->t.fusion.norm_weight);
    mg_launch_arg_ptr(&l, c->t.fusion.residual);
    mg_launch_arg_ptr(&l, c->t.fusion.argmax_ids);
    mg_launch_arg_u32(&l, (uint32_t)p->kind);
    mg_launch_arg_u32(&l, p->m);
    mg_launch_arg_u32(&l, p->n);
    mg_launch_arg_u32(&l, p->k);
    mg_launch_arg_u32(&l, p->ldc);
    mg_launch_arg_u32(&l, (uint32_t)p->out_type);
    mg_launch_arg_u32(&l, (uint32_t)p->fusion.prologue);
    mg_launch_arg_u32(&l, (uint32_t)p->fusion.epilogue);
    mg_launch_arg_f32(&l, p->fusion.eps);
    const char *kernel = "gemm_fused_ref";
    return mg_op_launch_kernels(b, s, &kernel, &l, 1);
}

static mg_status gemm_reference_run(mg_backend *b, mg_stream *s, const mg_gemm_call *c) {
    const mg_gemm_plan *p = &c->plan;
    mg_kv_append_args append;
    if (mg_gemm_kv_append_args(c, &append)) {
        /* the GEMM (with its prologue), then the append op itself on its rows: the front ran
         * the append's checks, so it is not refused after the GEMM was enqueued */
        mg_gemm_call product = *c;
        product.plan.fusion.epilogue = MG_GEMM_EPILOGUE_NONE;
        mg_status st = gemm_reference_run(b, s, &product);
        return st ? st : mg_kv_append(b, s, c->t.fusion.kv_cache, &append);
    }
    if (p->fusion.prologue != MG_GEMM_PROLOGUE_NONE || p->fusion.epilogue != MG_GEMM_EPILOGUE_NONE)
        return fused_run(b, s, c);
    if (p->kind == MG_GEMM_BF16)
        return mg_gemm_bf16_cpu_launch(b, s, c, "gemm_bf16_ref");
    mg_launch l;
    mg_launch_init(&l, (mg_dim3){1, 1, 1}, (mg_dim3){1, 1, 1}, 0);
    mg_launch_arg_ptr(&l, c->t.act);
    mg_launch_arg_ptr(&l, c->t.act_scale);
    mg_launch_arg_ptr(&l, c->t.weight);
    mg_launch_arg_ptr(&l, c->t.weight_scale);
    mg_launch_arg_ptr(&l, c->t.out);
    mg_launch_arg_u32(&l, p->m);
    mg_launch_arg_u32(&l, p->n);
    mg_launch_arg_u32(&l, p->k);
    mg_launch_arg_u32(&l, p->ldc);
    mg_launch_arg_u32(&l, (uint32_t)scaling_of(p, true));
    mg_launch_arg_u32(&l, (uint32_t)scaling_of(p, false));
    const char *kernel = "gemm_fp8_ref";
    return mg_op_launch_kernels(b, s, &kernel, &l, 1);
}

/* The reference GEMMs run on the CPU backend for every shape the front accepts; they are
 * batch-invariant by construction and need no workspace. */
static bool reference_supports(mg_backend *b, const void *call, char *reason, size_t reason_bytes) {
    (void)b;
    return mg_gemm_fusion_declared(&mg_gemm_reference_provider, call, reason, reason_bytes);
}

/* It runs every fusion the front accepts (BF16 and row-wise FP8): the definition of each. */
const mg_gemm_provider mg_gemm_reference_provider = {
    .base = {.name = "reference",
             .backend = MG_BACKEND_CPU,
             .supports = reference_supports,
             .register_cpu_kernels = mg_gemm_reference_kernels_register},
    .run = gemm_reference_run,
    .fusions = MG_GEMM_FUSES_PROLOGUE(MG_GEMM_PROLOGUE_RMSNORM) |
               MG_GEMM_FUSES_EPILOGUE(MG_GEMM_EPILOGUE_RESIDUAL_ADD) |
               MG_GEMM_FUSES_EPILOGUE(MG_GEMM_EPILOGUE_SILU_MUL) |
               MG_GEMM_FUSES_EPILOGUE(MG_GEMM_EPILOGUE_ARGMAX) |
               MG_GEMM_FUSES_EPILOGUE(MG_GEMM_EPILOGUE_KV_APPEND),
};
