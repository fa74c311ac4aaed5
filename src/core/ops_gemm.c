/* ops_gemm.c - the GEMM ops of metrale/ops_gemm.h: every argument checked once, then the CPU
 * reference or the CUDA (cuBLASLt) implementation. */
#include "backend_impl.h"
#include "checked_math.h"
#include "cpu/gemm_cpu.h"
#include "error.h"
#include "metrale/launch.h"
#include "op_cache.h"
#include "ops_gemm_impl.h"
#ifdef METRALE_HAVE_CUDA
#include "cuda/cublaslt.h"
#endif

static const char *kind_name(mg_gemm_kind kind) {
    switch (kind) {
    case MG_GEMM_BF16:
        return "mg_gemm_bf16";
    case MG_GEMM_FP8_TENSORWISE:
        return "mg_gemm_fp8_tensorwise";
    case MG_GEMM_FP8_ROWWISE:
        return "mg_gemm_fp8_rowwise";
    case MG_GEMM_FP8_BLOCKSCALED:
        return "mg_gemm_fp8_blockscaled";
    }
    return "mg_gemm";
}

static bool is_fp8(mg_gemm_kind kind) {
    return kind != MG_GEMM_BF16;
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

/* The shape, types and modes of a plan; shared by the calls and mg_gemm_prewarm. */
static mg_status check_plan(const mg_gemm_plan *p) {
    const char *what = kind_name(p->kind);
    if ((unsigned)p->kind > MG_GEMM_FP8_BLOCKSCALED)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "mg_gemm: unknown GEMM kind %d", (int)p->kind);
    if (p->m == 0 || p->n == 0 || p->k == 0)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: empty shape M=%u N=%u K=%u", what, p->m, p->n,
                        p->k);
    if (p->ldc < p->n)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: ldc=%u is less than N=%u", what, p->ldc,
                        p->n);
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

static mg_status check_pointer(const char *what, const char *name, mg_devptr p,
                               uint32_t alignment) {
    if (!p)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: %s is null", what, name);
    if (p % alignment)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: %s 0x%llx is not %u-byte aligned", what, name,
                        (unsigned long long)p, alignment);
    return MG_OK;
}

static mg_status check_call(mg_backend *b, mg_gemm_call *c) {
    if (mg_backend_get_kind(b) == MG_BACKEND_AUTO) /* what a NULL or closed handle reads as */
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: NULL, invalid or closed backend %p",
                        kind_name(c->plan.kind), (void *)b);
    mg_status st = check_plan(&c->plan);
    if (st)
        return st;
    const mg_gemm_plan *p = &c->plan;
    const char *what = kind_name(p->kind);
    bool fp8 = is_fp8(p->kind);
    uint32_t in_align = fp8 ? 16 : 2, out_align = fp8 ? 16 : (uint32_t)mg_dtype_bytes(p->out_type);
    if ((st = check_pointer(what, "act", c->act, in_align)) ||
        (st = check_pointer(what, "weight", c->weight, in_align)) ||
        (st = check_pointer(what, "out", c->out, out_align)))
        return st;
    if (fp8) {
        uint32_t scale_align = p->kind == MG_GEMM_FP8_TENSORWISE ? 4 : 16;
        if ((st = check_pointer(what, "act_scale", c->act_scale, scale_align)) ||
            (st = check_pointer(what, "weight_scale", c->weight_scale, scale_align)))
            return st;
    }
    /* Every operand must fit its buffer: nothing is read or written out of bounds. */
    size_t in_bytes = fp8 ? 1 : 2, out_bytes = mg_dtype_bytes(p->out_type);
    size_t act_span, weight_span, out_span;
    if (!mg_matrix_span_bytes(p->m, p->k, p->k, in_bytes, &act_span) ||
        !mg_matrix_span_bytes(p->n, p->k, p->k, in_bytes, &weight_span) ||
        !mg_matrix_span_bytes(p->m, p->n, p->ldc, out_bytes, &out_span))
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "%s: M=%u N=%u K=%u ldc=%u spans more bytes than the address space", what,
                        p->m, p->n, p->k, p->ldc);
    if ((st = mg_backend_check_device_range(b, c->act, act_span, what, "act")) ||
        (st = mg_backend_check_device_range(b, c->weight, weight_span, what, "weight")) ||
        (st = mg_backend_check_device_range(b, c->out, out_span, what, "out")))
        return st;
    if (fp8 && ((st = mg_backend_check_device_range(
                     b, c->act_scale, mg_gemm_scale_count(p, true) * 4, what, "act_scale")) ||
                (st = mg_backend_check_device_range(
                     b, c->weight_scale, mg_gemm_scale_count(p, false) * 4, what, "weight_scale"))))
        return st;
    uint32_t a = pointer_alignment(c->act | c->weight | c->out);
    c->plan.pointer_alignment = a;
    return MG_OK;
}

/* ------------------------------------------------------------------ built-in kernels */

/* Launches kernel `function` of module "metrale" (memoised in the op cache). The CPU backend's
 * reference kernels are registered on first use. */
static mg_status launch_builtin(mg_backend *b, mg_stream *s, const char *function, mg_launch *l) {
    mg_gemm_cpu_kernels_register();
    mg_op_cache *cache = mg_backend_op_cache(b);
    if (!cache)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: invalid or closed backend", function);
    mg_kernel *k;
    mg_status st = mg_op_cache_kernel(cache, "metrale", function, false, &k);
    return st ? st : mg_launch_run(b, k, s, l);
}

static mg_fp8_scaling scaling_of(const mg_gemm_plan *p, bool is_act) {
    if (p->kind == MG_GEMM_FP8_TENSORWISE)
        return MG_FP8_SCALING_TENSOR;
    if (p->kind == MG_GEMM_FP8_ROWWISE)
        return MG_FP8_SCALING_ROW;
    return (is_act ? p->act_mode : p->weight_mode) == MG_FP8_BLOCK_1X128 ? MG_FP8_SCALING_1X128
                                                                         : MG_FP8_SCALING_128X128;
}

/* The CPU backend runs the reference as a kernel (gemm_cpu.h): stream-ordered, capturable,
 * every buffer range checked against the live allocations when it runs. */
static mg_status gemm_cpu(mg_backend *b, mg_stream *s, const mg_gemm_call *c) {
    const mg_gemm_plan *p = &c->plan;
    mg_launch l;
    mg_launch_init(&l, (mg_dim3){1, 1, 1}, (mg_dim3){1, 1, 1}, 0);
    if (p->kind == MG_GEMM_BF16) {
        mg_launch_arg_ptr(&l, c->act);
        mg_launch_arg_ptr(&l, c->weight);
        mg_launch_arg_ptr(&l, c->out);
        mg_launch_arg_u32(&l, p->m);
        mg_launch_arg_u32(&l, p->n);
        mg_launch_arg_u32(&l, p->k);
        mg_launch_arg_u32(&l, p->ldc);
        mg_launch_arg_u32(&l, (uint32_t)p->out_type);
        return launch_builtin(b, s, "gemm_bf16_ref", &l);
    }
    mg_launch_arg_ptr(&l, c->act);
    mg_launch_arg_ptr(&l, c->act_scale);
    mg_launch_arg_ptr(&l, c->weight);
    mg_launch_arg_ptr(&l, c->weight_scale);
    mg_launch_arg_ptr(&l, c->out);
    mg_launch_arg_u32(&l, p->m);
    mg_launch_arg_u32(&l, p->n);
    mg_launch_arg_u32(&l, p->k);
    mg_launch_arg_u32(&l, p->ldc);
    mg_launch_arg_u32(&l, (uint32_t)scaling_of(p, true));
    mg_launch_arg_u32(&l, (uint32_t)scaling_of(p, false));
    return launch_builtin(b, s, "gemm_fp8_ref", &l);
}

/* ------------------------------------------------------------------ dispatch */

static mg_status run_call(mg_backend *b, mg_stream *s, mg_gemm_call *c) {
    mg_status st = check_call(b, c);
    if (st)
        return st;
    switch (mg_backend_get_kind(b)) {
    case MG_BACKEND_CPU:
        return gemm_cpu(b, s, c);
#ifdef METRALE_HAVE_CUDA
    case MG_BACKEND_CUDA:
        return mg_cublaslt_gemm(b, s, c);
#endif
    default:
        break;
    }
    return MG_ERROR(MG_ERR_UNSUPPORTED, "%s: not implemented on the %s backend",
                    kind_name(c->plan.kind), mg_backend_kind_name(mg_backend_get_kind(b)));
}

mg_status mg_gemm_bf16(mg_backend *b, mg_stream *s, uint32_t m, uint32_t n, uint32_t k,
                       mg_devptr act, mg_devptr weight, mg_devptr out, mg_dtype out_type,
                       uint32_t ldc) {
    mg_gemm_call c = {
        .plan = {.kind = MG_GEMM_BF16, .m = m, .n = n, .k = k, .ldc = ldc, .out_type = out_type},
        .act = act,
        .weight = weight,
        .out = out};
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
                      .act = act,
                      .weight = weight,
                      .out = out,
                      .act_scale = act_scale,
                      .weight_scale = weight_scale};
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
    if (mg_backend_get_kind(b) == MG_BACKEND_AUTO)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: NULL, invalid or closed backend %p", what,
                        (void *)b);
    if (m == 0 || k == 0)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: empty shape M=%u K=%u", what, m, k);
    if (m_pad < m || m_pad % 4)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: m_pad=%u must be >= M=%u and a multiple of 4",
                        what, m_pad, m);
    mg_status st;
    if ((st = check_pointer(what, "src", src, 4)) || (st = check_pointer(what, "dst", dst, 4)))
        return st;
    uint64_t blocks = mg_fp8_k_blocks(k);
    uint64_t src_bytes = blocks * m * 4, dst_bytes = blocks * m_pad * 4; /* < 2^62 */
    if ((st = mg_backend_check_device_range(b, src, src_bytes, what, "src")) ||
        (st = mg_backend_check_device_range(b, dst, dst_bytes, what, "dst")))
        return st;
    if (src < dst + dst_bytes && dst < src + src_bytes)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: src and dst overlap", what);
    /* The same kernel, with the same arguments, on every backend (CUDA:
     * kernels/cuda/fp8_scale_layout.cu; CPU: gemm_cpu.c). */
    mg_dim3 grid, block;
    mg_launch_config_1d(blocks * m_pad, 256, &grid, &block);
    mg_launch l;
    mg_launch_init(&l, grid, block, 0);
    mg_launch_arg_ptr(&l, src);
    mg_launch_arg_ptr(&l, dst);
    mg_launch_arg_u32(&l, m);
    mg_launch_arg_u32(&l, m_pad);
    mg_launch_arg_u32(&l, (uint32_t)blocks);
    return launch_builtin(b, s, "fp8_act_scales_transpose", &l);
}

/* ------------------------------------------------------------------ planning and modes */

bool mg_gemm_supports(mg_backend *b, mg_capability cap) {
    if (cap != MG_CAP_OP_GEMM_BF16 && cap != MG_CAP_OP_GEMM_FP8)
        return false;
    switch (mg_backend_get_kind(b)) {
    case MG_BACKEND_CPU:
        return true;
#ifdef METRALE_HAVE_CUDA
    case MG_BACKEND_CUDA: {
        mg_device_info info;
        if (!mg_cublaslt_available(NULL, 0))
            return false;
        return cap == MG_CAP_OP_GEMM_BF16 ||
               (mg_device_get_info(b, &info) == MG_OK && info.cc_major >= 9);
    }
#endif
    default:
        return false;
    }
}

void mg_gemm_release(mg_backend *b) {
#ifdef METRALE_HAVE_CUDA
    if (mg_backend_get_kind(b) == MG_BACKEND_CUDA)
        mg_cublaslt_release(b);
#else
    (void)b;
#endif
}

void mg_gemm_stream_destroyed(mg_backend *b, mg_stream *s) {
#ifdef METRALE_HAVE_CUDA
    if (mg_backend_get_kind(b) == MG_BACKEND_CUDA)
        mg_cublaslt_stream_destroyed(b, s);
#else
    (void)b;
    (void)s;
#endif
}

mg_status mg_gemm_prewarm(mg_backend *b, mg_stream *s, const mg_gemm_plan *plans, size_t count) {
    if (mg_backend_get_kind(b) == MG_BACKEND_AUTO || (count && !plans))
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "mg_gemm_prewarm: %s",
                        count && !plans ? "NULL plans" : "NULL, invalid or closed backend");
    for (size_t i = 0; i < count; i++) {
        mg_status st = check_plan(&plans[i]);
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
    mg_status st = mg_stream_check_not_capturing(b, s, "mg_gemm_prewarm");
    if (st)
        return st;
#ifdef METRALE_HAVE_CUDA
    if (mg_backend_get_kind(b) == MG_BACKEND_CUDA)
        return mg_cublaslt_prewarm(b, s, plans, count);
#endif
    return MG_OK;
}

mg_status mg_gemm_set_batch_invariant(mg_backend *b, bool enabled) {
    if (mg_backend_get_kind(b) == MG_BACKEND_AUTO)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "mg_gemm_set_batch_invariant: NULL, invalid or "
                        "closed backend %p",
                        (void *)b);
#ifdef METRALE_HAVE_CUDA
    if (mg_backend_get_kind(b) == MG_BACKEND_CUDA)
        return mg_cublaslt_set_batch_invariant(b, enabled);
#endif
    (void)enabled; /* the CPU reference computes every row alike whatever M is */
    return MG_OK;
}

bool mg_gemm_batch_invariant(mg_backend *b) {
#ifdef METRALE_HAVE_CUDA
    if (b && mg_backend_get_kind(b) == MG_BACKEND_CUDA)
        return mg_cublaslt_batch_invariant(b);
#endif
    return b && mg_backend_get_kind(b) == MG_BACKEND_CPU;
}
