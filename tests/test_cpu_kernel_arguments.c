/*
 * test_cpu_kernel_arguments.c - the CPU backend's built-in kernels launched directly, with
 * argument lists a caller got wrong. The kernels are public (mg_kernel_lookup finds them by
 * name), so each one must refuse a wrong count or kind of arguments, a misaligned, null,
 * freed or too small buffer (exact-size allocations), and values that would make it touch
 * memory outside its buffers. Messages name the kernel and the argument. The destinations of
 * the launches that must not write sit between guard bytes that are read back.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "metrale/dtype.h"
#include "metrale/gpu.h"
#include "metrale/launch.h"
#include "metrale/ops_attention.h"
#include "metrale/ops_gemm.h"
#include "test_util.h"

#define GUARD 64
#define POISON 0xa5

#define CHECK_ERROR(expr, status, needle)                                                          \
    do {                                                                                           \
        mg_clear_error();                                                                          \
        CHECK_STATUS(expr, status);                                                                \
        CHECK_MESSAGE(needle);                                                                     \
    } while (0)

/* A device buffer of `bytes` between two poisoned guards. */
typedef struct guarded {
    mg_backend *b;
    mg_devptr base, ptr;
    size_t bytes;
} guarded;

static guarded guarded_alloc(mg_backend *b, size_t bytes) {
    guarded g = {.b = b, .bytes = bytes};
    CHECK_OK(mg_alloc(b, bytes + 2 * GUARD, &g.base));
    CHECK_OK(mg_memset(b, g.base, POISON, bytes + 2 * GUARD));
    g.ptr = g.base + GUARD;
    return g;
}

/* The guards still hold the poison; frees the buffer. */
static void guarded_check_free(guarded *g, const char *what) {
    uint8_t *all = malloc(g->bytes + 2 * GUARD);
    CHECK_OK(mg_copy_d2h(g->b, all, g->base, g->bytes + 2 * GUARD));
    size_t touched = 0;
    for (size_t i = 0; i < GUARD; i++)
        touched += (all[i] != POISON) + (all[GUARD + g->bytes + i] != POISON);
    if (touched)
        fprintf(stderr, "FAIL %s: %zu guard bytes were overwritten\n", what, touched);
    CHECK(touched == 0);
    free(all);
    CHECK_OK(mg_free(g->b, g->base));
}

/* A device allocation of exactly `bytes`: any range past it is refused. */
static mg_devptr exact_alloc(mg_backend *b, size_t bytes) {
    mg_devptr p = 0;
    CHECK_OK(mg_alloc(b, bytes, &p));
    return p;
}

static mg_status noop_kernel(const mg_launch *l) {
    (void)l;
    return MG_OK;
}

static mg_kernel *kernel(mg_backend *b, const char *module, const char *function) {
    mg_kernel *k = NULL;
    CHECK_OK(mg_kernel_lookup(b, module, function, &k));
    return k;
}

static void one_block(mg_launch *l) {
    mg_launch_init(l, (mg_dim3){1, 1, 1}, (mg_dim3){1, 1, 1}, 0);
}

static void test_vector_add(mg_backend *b) {
    mg_kernel *k = kernel(b, "metrale", "vector_add");
    guarded x = guarded_alloc(b, 64), y = guarded_alloc(b, 64), out = guarded_alloc(b, 64);
    float fx[16], fy[16], fo[16];
    for (int i = 0; i < 16; i++)
        fx[i] = (float)i * 0.5f, fy[i] = (float)(100 - i);
    CHECK_OK(mg_copy_h2d(b, x.ptr, fx, 64));
    CHECK_OK(mg_copy_h2d(b, y.ptr, fy, 64));
    mg_launch l;

    one_block(&l);
    mg_launch_arg_ptr(&l, x.ptr);
    mg_launch_arg_ptr(&l, y.ptr);
    mg_launch_arg_ptr(&l, out.ptr);
    CHECK_ERROR(mg_launch_run(b, k, NULL, &l), MG_ERR_INVALID_ARGUMENT,
                "cpu kernel metrale:vector_add: takes 4 arguments, launched with 3");

    /* the fourth argument of every other kind; the kinds are named */
    static const struct {
        mg_arg_kind kind;
        const char *name;
    } kinds[] = {{MG_ARG_BUFFER, "buffer"}, {MG_ARG_I32, "i32"},
                 {MG_ARG_U64, "u64"},       {MG_ARG_F32, "f32"},
                 {MG_ARG_BYTES, "bytes"},   {MG_ARG_TENSOR_MAP, "tensor_map"}};
    static const uint8_t map[MG_TENSOR_MAP_BYTES] = {0};
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
        one_block(&l);
        mg_launch_arg_ptr(&l, x.ptr);
        mg_launch_arg_ptr(&l, y.ptr);
        mg_launch_arg_ptr(&l, out.ptr);
        switch (kinds[i].kind) {
        case MG_ARG_BUFFER:
            mg_launch_arg_ptr(&l, x.ptr);
            break;
        case MG_ARG_I32:
            mg_launch_arg_i32(&l, 16);
            break;
        case MG_ARG_U64:
            mg_launch_arg_u64(&l, 16);
            break;
        case MG_ARG_F32:
            mg_launch_arg_f32(&l, 16.0f);
            break;
        case MG_ARG_BYTES:
            mg_launch_arg_bytes(&l, "sixteen", 8);
            break;
        default:
            mg_launch_arg_tensor_map(&l, map);
            break;
        }
        char want[96];
        snprintf(want, sizeof want, "argument 3 must be u32, launched with %s", kinds[i].name);
        CHECK_ERROR(mg_launch_run(b, k, NULL, &l), MG_ERR_INVALID_ARGUMENT, want);
    }
    one_block(&l);
    mg_launch_arg_u32(&l, 1);
    mg_launch_arg_ptr(&l, y.ptr);
    mg_launch_arg_ptr(&l, out.ptr);
    mg_launch_arg_u32(&l, 16);
    CHECK_ERROR(mg_launch_run(b, k, NULL, &l), MG_ERR_INVALID_ARGUMENT,
                "argument 0 must be buffer, launched with u32");

    /* buffers: misaligned, null, too small */
    mg_devptr ex = exact_alloc(b, 64);
    struct {
        mg_devptr a, b, out;
        uint32_t n;
        const char *needle;
    } bad[] = {
        {ex + 2, ex, ex, 4, "argument 0 (0x"},
        {ex, ex, 0, 4, "metrale:vector_add argument 2: null device pointer"},
        {ex, ex + 4, ex, 16, "argument 1: 64 bytes at offset 4 overrun the 64-byte allocation"},
        {ex, ex, ex, 17, "argument 0: 68 bytes at offset 0 overrun"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        one_block(&l);
        mg_launch_arg_ptr(&l, bad[i].a);
        mg_launch_arg_ptr(&l, bad[i].b);
        mg_launch_arg_ptr(&l, bad[i].out);
        mg_launch_arg_u32(&l, bad[i].n);
        CHECK_ERROR(mg_launch_run(b, k, NULL, &l), MG_ERR_INVALID_ARGUMENT, bad[i].needle);
    }
    one_block(&l);
    mg_launch_arg_ptr(&l, ex + 2);
    mg_launch_arg_ptr(&l, ex);
    mg_launch_arg_ptr(&l, ex);
    mg_launch_arg_u32(&l, 1);
    CHECK_ERROR(mg_launch_run(b, k, NULL, &l), MG_ERR_INVALID_ARGUMENT, "is misaligned: needs 4");
    CHECK_OK(mg_free(b, ex));

    /* a correct launch computes */
    one_block(&l);
    mg_launch_arg_ptr(&l, x.ptr);
    mg_launch_arg_ptr(&l, y.ptr);
    mg_launch_arg_ptr(&l, out.ptr);
    mg_launch_arg_u32(&l, 16);
    CHECK_OK(mg_launch_run(b, k, NULL, &l));
    CHECK_OK(mg_copy_d2h(b, fo, out.ptr, 64));
    size_t wrong = 0;
    for (int i = 0; i < 16; i++)
        wrong += fo[i] != fx[i] + fy[i];
    CHECK(wrong == 0);

    guarded_check_free(&x, "vector_add x");
    guarded_check_free(&y, "vector_add y");
    guarded_check_free(&out, "vector_add out");
    /* a freed operand */
    CHECK_ERROR(mg_launch_run(b, k, NULL, &l), MG_ERR_INVALID_ARGUMENT,
                "is not inside any live allocation");
    CHECK_OK(mg_kernel_release(k));
}

/* gemm_bf16_ref(act, weight, out, m, n, k, ldc, out_type) */
static void gemm_bf16_args(mg_launch *l, mg_devptr act, mg_devptr weight, mg_devptr out, uint32_t m,
                           uint32_t n, uint32_t k, uint32_t ldc, uint32_t out_type) {
    one_block(l);
    mg_launch_arg_ptr(l, act);
    mg_launch_arg_ptr(l, weight);
    mg_launch_arg_ptr(l, out);
    mg_launch_arg_u32(l, m);
    mg_launch_arg_u32(l, n);
    mg_launch_arg_u32(l, k);
    mg_launch_arg_u32(l, ldc);
    mg_launch_arg_u32(l, out_type);
}

static void test_gemm_bf16_kernel(mg_backend *b) {
    /* the reference kernels are registered by the first GEMM call */
    mg_devptr warm = exact_alloc(b, 4096);
    CHECK_OK(mg_gemm_bf16(b, NULL, 4, 4, 4, warm, warm + 1024, warm + 2048, MG_DTYPE_F32, 4));
    CHECK_OK(mg_free(b, warm));
    mg_kernel *k = kernel(b, "metrale", "gemm_bf16_ref");
    const uint32_t m = 2, n = 3, kk = 4;
    guarded act = guarded_alloc(b, m * kk * 2), weight = guarded_alloc(b, n * kk * 2);
    guarded out = guarded_alloc(b, m * n * 4);
    uint16_t a[8], w[12];
    for (int i = 0; i < 8; i++)
        a[i] = mg_f32_to_bf16((float)(i + 1));
    for (int i = 0; i < 12; i++)
        w[i] = mg_f32_to_bf16((float)(i % 3) - 1.0f);
    CHECK_OK(mg_copy_h2d(b, act.ptr, a, sizeof a));
    CHECK_OK(mg_copy_h2d(b, weight.ptr, w, sizeof w));
    mg_launch l;

    one_block(&l);
    CHECK_ERROR(mg_launch_run(b, k, NULL, &l), MG_ERR_INVALID_ARGUMENT,
                "metrale:gemm_bf16_ref: takes 8 arguments, launched with 0");
    mg_devptr ea = exact_alloc(b, m * kk * 2), ew = exact_alloc(b, n * kk * 2),
              eo = exact_alloc(b, m * n * 4);
    gemm_bf16_args(&l, ea, ew, eo, m + 1, n, kk, n, MG_DTYPE_F32);
    CHECK_ERROR(mg_launch_run(b, k, NULL, &l), MG_ERR_INVALID_ARGUMENT, "argument 0: 24 bytes");
    gemm_bf16_args(&l, ea, ew, eo, m, n + 1, kk, n + 1, MG_DTYPE_F32);
    CHECK_ERROR(mg_launch_run(b, k, NULL, &l), MG_ERR_INVALID_ARGUMENT, "argument 1: 32 bytes");
    gemm_bf16_args(&l, ea, ew, eo, m, n, kk, n + 2, MG_DTYPE_F32);
    CHECK_ERROR(mg_launch_run(b, k, NULL, &l), MG_ERR_INVALID_ARGUMENT, "argument 2: 32 bytes");
    gemm_bf16_args(&l, ea, ew, eo + 2, m, n, kk, n, MG_DTYPE_F32);
    CHECK_ERROR(mg_launch_run(b, k, NULL, &l), MG_ERR_INVALID_ARGUMENT, "needs 4-byte alignment");
    /* a shape whose span does not fit 64 bits is refused as such, not wrapped */
    gemm_bf16_args(&l, ea, ew, eo, UINT32_MAX, n, UINT32_MAX, n, MG_DTYPE_F32);
    CHECK_ERROR(mg_launch_run(b, k, NULL, &l), MG_ERR_INVALID_ARGUMENT,
                "argument 0: 18446744073709551615 bytes");
    CHECK_MESSAGE("wrap the address space");
    CHECK_OK(mg_free(b, ea));
    CHECK_OK(mg_free(b, ew));
    CHECK_OK(mg_free(b, eo));
    /* output types other than f32 and bf16 would be written as bf16 into a buffer checked for
     * another element size */
    static const mg_dtype others[] = {MG_DTYPE_F16, MG_DTYPE_FP8_E4M3, MG_DTYPE_U8,
                                      MG_DTYPE_I32, MG_DTYPE_U32,      (mg_dtype)77};
    for (size_t i = 0; i < sizeof others / sizeof others[0]; i++) {
        gemm_bf16_args(&l, act.ptr, weight.ptr, out.ptr, m, n, kk, n, others[i]);
        CHECK_ERROR(mg_launch_run(b, k, NULL, &l), MG_ERR_INVALID_ARGUMENT, "expected bf16 or f32");
    }

    /* correct: out = act . weight^T, exact in f32 for these small integers */
    gemm_bf16_args(&l, act.ptr, weight.ptr, out.ptr, m, n, kk, n, MG_DTYPE_F32);
    CHECK_OK(mg_launch_run(b, k, NULL, &l));
    float o[6];
    CHECK_OK(mg_copy_d2h(b, o, out.ptr, sizeof o));
    size_t wrong = 0;
    for (uint32_t t = 0; t < m; t++)
        for (uint32_t j = 0; j < n; j++) {
            float want = 0;
            for (uint32_t i = 0; i < kk; i++)
                want += mg_bf16_to_f32(a[t * kk + i]) * mg_bf16_to_f32(w[j * kk + i]);
            wrong += o[t * n + j] != want;
        }
    CHECK(wrong == 0);
    guarded_check_free(&act, "gemm_bf16 act");
    guarded_check_free(&weight, "gemm_bf16 weight");
    guarded_check_free(&out, "gemm_bf16 out");
    CHECK_OK(mg_kernel_release(k));
}

/* gemm_fp8_ref(act, act_scale, weight, weight_scale, out, m, n, k, ldc, act_scaling,
 * weight_scaling); the scalings are numbered as below in its argument list */
enum { SCALING_TENSOR, SCALING_ROW, SCALING_1X128, SCALING_128X128 };
static void gemm_fp8_args(mg_launch *l, const mg_devptr ptrs[5], uint32_t m, uint32_t n, uint32_t k,
                          uint32_t ldc, uint32_t act_scaling, uint32_t weight_scaling) {
    one_block(l);
    for (int i = 0; i < 5; i++)
        mg_launch_arg_ptr(l, ptrs[i]);
    mg_launch_arg_u32(l, m);
    mg_launch_arg_u32(l, n);
    mg_launch_arg_u32(l, k);
    mg_launch_arg_u32(l, ldc);
    mg_launch_arg_u32(l, act_scaling);
    mg_launch_arg_u32(l, weight_scaling);
}

static void test_gemm_fp8_kernel(mg_backend *b) {
    mg_kernel *k = kernel(b, "metrale", "gemm_fp8_ref");
    const uint32_t m = 16, n = 16, kk = 32;
    guarded act = guarded_alloc(b, m * kk), weight = guarded_alloc(b, n * kk);
    guarded act_scale = guarded_alloc(b, 4 * m), weight_scale = guarded_alloc(b, 4 * n);
    guarded out = guarded_alloc(b, m * n * 2);
    const mg_devptr good[5] = {act.ptr, act_scale.ptr, weight.ptr, weight_scale.ptr, out.ptr};
    mg_launch l;

    one_block(&l);
    mg_launch_arg_u32(&l, 1);
    CHECK_ERROR(mg_launch_run(b, k, NULL, &l), MG_ERR_INVALID_ARGUMENT,
                "metrale:gemm_fp8_ref: takes 11 arguments, launched with 1");
    /* each buffer in turn too small: exact allocations, the pointer moved 16 bytes in */
    const mg_devptr exact[5] = {exact_alloc(b, m * kk), exact_alloc(b, 4 * m),
                                exact_alloc(b, n * kk), exact_alloc(b, 4 * n),
                                exact_alloc(b, m * n * 2)};
    for (int i = 0; i < 5; i++) {
        mg_devptr ptrs[5];
        memcpy(ptrs, exact, sizeof ptrs);
        ptrs[i] += 16;
        gemm_fp8_args(&l, ptrs, m, n, kk, n, SCALING_ROW, SCALING_ROW);
        char want[32];
        snprintf(want, sizeof want, "argument %d:", i);
        CHECK_ERROR(mg_launch_run(b, k, NULL, &l), MG_ERR_INVALID_ARGUMENT, want);
        CHECK_MESSAGE("overrun");
    }
    mg_devptr misaligned[5];
    memcpy(misaligned, exact, sizeof misaligned);
    misaligned[4] += 8;
    gemm_fp8_args(&l, misaligned, m, n, kk, n, SCALING_TENSOR, SCALING_TENSOR);
    CHECK_ERROR(mg_launch_run(b, k, NULL, &l), MG_ERR_INVALID_ARGUMENT, "needs 16-byte alignment");
    /* block scales need more than the per-row scales allocated here */
    gemm_fp8_args(&l, exact, m, n, 128, n, SCALING_ROW, SCALING_ROW);
    CHECK_ERROR(mg_launch_run(b, k, NULL, &l), MG_ERR_INVALID_ARGUMENT, "argument 0: 2048 bytes");
    gemm_fp8_args(&l, exact, m, n, kk, n, SCALING_ROW, 9);
    CHECK_ERROR(mg_launch_run(b, k, NULL, &l), MG_ERR_INVALID_ARGUMENT,
                "unknown scaling (act 1, weight 9)");
    gemm_fp8_args(&l, exact, 256, n, kk, n, SCALING_TENSOR, SCALING_1X128);
    CHECK_ERROR(mg_launch_run(b, k, NULL, &l), MG_ERR_INVALID_ARGUMENT, "argument 0: 8192 bytes");
    for (int i = 0; i < 5; i++)
        CHECK_OK(mg_free(b, exact[i]));

    /* correct, with per-tensor scales: codes of 1.0 and 2.0 give k * 2 * scales */
    uint8_t ones[16 * 32], twos[16 * 32];
    memset(ones, mg_f32_to_fp8_e4m3(1.0f), sizeof ones);
    memset(twos, mg_f32_to_fp8_e4m3(2.0f), sizeof twos);
    float sa = 0.5f, sw = 0.25f;
    CHECK_OK(mg_copy_h2d(b, act.ptr, ones, sizeof ones));
    CHECK_OK(mg_copy_h2d(b, weight.ptr, twos, sizeof twos));
    CHECK_OK(mg_copy_h2d(b, act_scale.ptr, &sa, 4));
    CHECK_OK(mg_copy_h2d(b, weight_scale.ptr, &sw, 4));
    gemm_fp8_args(&l, good, m, n, kk, n, SCALING_TENSOR, SCALING_TENSOR);
    CHECK_OK(mg_launch_run(b, k, NULL, &l));
    uint16_t o[16 * 16];
    CHECK_OK(mg_copy_d2h(b, o, out.ptr, sizeof o));
    CHECK(mg_bf16_to_f32(o[0]) == 8.0f && mg_bf16_to_f32(o[255]) == 8.0f);

    guarded_check_free(&act, "gemm_fp8 act");
    guarded_check_free(&weight, "gemm_fp8 weight");
    guarded_check_free(&act_scale, "gemm_fp8 act_scale");
    guarded_check_free(&weight_scale, "gemm_fp8 weight_scale");
    guarded_check_free(&out, "gemm_fp8 out");
    CHECK_OK(mg_kernel_release(k));
}

/* fp8_act_scales_transpose(src, dst, m, m_pad, blocks) */
static void transpose_args(mg_launch *l, mg_devptr src, mg_devptr dst, uint32_t m, uint32_t m_pad,
                           uint32_t blocks) {
    one_block(l);
    mg_launch_arg_ptr(l, src);
    mg_launch_arg_ptr(l, dst);
    mg_launch_arg_u32(l, m);
    mg_launch_arg_u32(l, m_pad);
    mg_launch_arg_u32(l, blocks);
}

static void test_scale_transpose_kernel(mg_backend *b) {
    mg_kernel *k = kernel(b, "metrale", "fp8_act_scales_transpose");
    const uint32_t m = 6, m_pad = 8, blocks = 3;
    guarded src = guarded_alloc(b, 4 * m * blocks), dst = guarded_alloc(b, 4 * m_pad * blocks);
    float s[6 * 3];
    for (uint32_t i = 0; i < m * blocks; i++)
        s[i] = (float)i + 0.5f;
    CHECK_OK(mg_copy_h2d(b, src.ptr, s, sizeof s));
    mg_launch l;

    one_block(&l);
    mg_launch_arg_ptr(&l, src.ptr);
    CHECK_ERROR(mg_launch_run(b, k, NULL, &l), MG_ERR_INVALID_ARGUMENT, "takes 5 arguments");
    mg_devptr es = exact_alloc(b, 4 * m * blocks), ed = exact_alloc(b, 4 * m_pad * blocks);
    transpose_args(&l, es, ed, m + 1, m_pad, blocks);
    CHECK_ERROR(mg_launch_run(b, k, NULL, &l), MG_ERR_INVALID_ARGUMENT, "argument 0: 84 bytes");
    transpose_args(&l, es, ed, m, m_pad + 4, blocks);
    CHECK_ERROR(mg_launch_run(b, k, NULL, &l), MG_ERR_INVALID_ARGUMENT, "argument 1: 144 bytes");
    transpose_args(&l, es, ed + 2, m, m_pad, blocks);
    CHECK_ERROR(mg_launch_run(b, k, NULL, &l), MG_ERR_INVALID_ARGUMENT, "needs 4-byte alignment");
    CHECK_OK(mg_free(b, es));
    CHECK_OK(mg_free(b, ed));
    /* fewer padded rows than rows: the kernel would write past each block's rows */
    transpose_args(&l, src.ptr, dst.ptr, m, 4, blocks);
    CHECK_ERROR(mg_launch_run(b, k, NULL, &l), MG_ERR_INVALID_ARGUMENT, "m_pad 4 is less than m 6");

    transpose_args(&l, src.ptr, dst.ptr, m, m_pad, blocks);
    CHECK_OK(mg_launch_run(b, k, NULL, &l));
    float d[8 * 3];
    CHECK_OK(mg_copy_d2h(b, d, dst.ptr, sizeof d));
    size_t wrong = 0;
    for (uint32_t g = 0; g < blocks; g++)
        for (uint32_t t = 0; t < m_pad; t++)
            wrong += d[g * m_pad + t] != (t < m ? s[t * blocks + g] : 0.0f);
    CHECK(wrong == 0);
    guarded_check_free(&src, "transpose src");
    guarded_check_free(&dst, "transpose dst");
    CHECK_OK(mg_kernel_release(k));
}

/* metrale_ops:attention_ragged_prefill(q, k, v, o, lse, indptrs, batch, qo_heads, kv_heads,
 * head_dim, causal, window_left, sm_scale, qo_rows, kv_rows, has_lse) */
typedef struct attention_launch {
    mg_devptr q, k, v, o, lse, indptrs;
    uint32_t batch, qo_heads, kv_heads, d, causal;
    int32_t window_left;
    float sm_scale;
    uint32_t qo_rows, kv_rows, has_lse;
} attention_launch;

static void attention_args(mg_launch *l, const attention_launch *a) {
    one_block(l);
    mg_launch_arg_ptr(l, a->q);
    mg_launch_arg_ptr(l, a->k);
    mg_launch_arg_ptr(l, a->v);
    mg_launch_arg_ptr(l, a->o);
    mg_launch_arg_ptr(l, a->lse);
    mg_launch_arg_ptr(l, a->indptrs);
    mg_launch_arg_u32(l, a->batch);
    mg_launch_arg_u32(l, a->qo_heads);
    mg_launch_arg_u32(l, a->kv_heads);
    mg_launch_arg_u32(l, a->d);
    mg_launch_arg_u32(l, a->causal);
    mg_launch_arg_i32(l, a->window_left);
    mg_launch_arg_f32(l, a->sm_scale);
    mg_launch_arg_u32(l, a->qo_rows);
    mg_launch_arg_u32(l, a->kv_rows);
    mg_launch_arg_u32(l, a->has_lse);
}

static void test_attention_kernel(mg_backend *b) {
    /* the kernel is registered by the first plan */
    mg_attention_desc desc = {
        .num_qo_heads = 2, .num_kv_heads = 1, .head_dim = 8, .window_left = -1, .sm_scale = 0.5f};
    int32_t qo[3] = {0, 2, 3}, kv[3] = {0, 3, 5};
    mg_attention_plan *plan = NULL;
    CHECK_OK(mg_attention_plan_create(b, &desc, qo, kv, 2, NULL, &plan));
    CHECK_OK(mg_attention_plan_destroy(plan));
    mg_kernel *k = kernel(b, "metrale", "attention_ragged_prefill");

    /* 3 query rows x 2 heads x 8, 5 key rows x 1 head x 8, bf16; lse 3 x 2 f32; exact sizes */
    mg_devptr q = exact_alloc(b, 96), o = exact_alloc(b, 96), kk = exact_alloc(b, 80),
              v = exact_alloc(b, 80), lse = exact_alloc(b, 24), ind = exact_alloc(b, 24);
    uint16_t ones[48];
    for (int i = 0; i < 48; i++)
        ones[i] = mg_f32_to_bf16(1.0f);
    CHECK_OK(mg_copy_h2d(b, q, ones, 96));
    CHECK_OK(mg_copy_h2d(b, kk, ones, 80));
    CHECK_OK(mg_copy_h2d(b, v, ones, 80));
    int32_t indptrs[6] = {0, 2, 3, 0, 3, 5};
    CHECK_OK(mg_copy_h2d(b, ind, indptrs, sizeof indptrs));
    const attention_launch good = {q, kk, v, o, lse, ind, 2, 2, 1, 8, 0, -1, 0.5f, 3, 5, 1};
    mg_launch l;
    attention_launch a;

    a = good, a.qo_heads = 3, a.kv_heads = 2;
    attention_args(&l, &a);
    CHECK_ERROR(mg_launch_run(b, k, NULL, &l), MG_ERR_INVALID_ARGUMENT,
                "bad shape (batch 2, heads 3/2, head_dim 8)");
    a = good, a.d = 12;
    attention_args(&l, &a);
    CHECK_ERROR(mg_launch_run(b, k, NULL, &l), MG_ERR_INVALID_ARGUMENT, "head_dim 12");
    a = good, a.batch = 0;
    attention_args(&l, &a);
    CHECK_ERROR(mg_launch_run(b, k, NULL, &l), MG_ERR_INVALID_ARGUMENT, "bad shape (batch 0");
    a = good, a.qo_heads = 0;
    attention_args(&l, &a);
    CHECK_ERROR(mg_launch_run(b, k, NULL, &l), MG_ERR_INVALID_ARGUMENT, "heads 0/1");
    a = good, a.kv_heads = 0;
    attention_args(&l, &a);
    CHECK_ERROR(mg_launch_run(b, k, NULL, &l), MG_ERR_INVALID_ARGUMENT, "heads 2/0");
    a = good, a.d = 0;
    attention_args(&l, &a);
    CHECK_ERROR(mg_launch_run(b, k, NULL, &l), MG_ERR_INVALID_ARGUMENT, "head_dim 0)");
    /* k/v overflow while q/o fit: one query row, five key rows of 2^62 elements */
    a = good, a.qo_heads = 0x80000000u, a.kv_heads = 0x80000000u, a.d = 0x80000000u;
    a.qo_rows = 1;
    attention_args(&l, &a);
    CHECK_ERROR(mg_launch_run(b, k, NULL, &l), MG_ERR_INVALID_ARGUMENT,
                "shape overflows the address space (1 / 5 rows");
    a = good, a.q = q + 2;
    attention_args(&l, &a);
    CHECK_ERROR(mg_launch_run(b, k, NULL, &l), MG_ERR_INVALID_ARGUMENT, "argument 0 (0x");
    a = good, a.qo_heads = 0x80000000u, a.kv_heads = 0x80000000u, a.d = 0x80000000u;
    attention_args(&l, &a);
    CHECK_ERROR(mg_launch_run(b, k, NULL, &l), MG_ERR_INVALID_ARGUMENT,
                "shape overflows the address space");
    a = good, a.kv_rows = 6;
    attention_args(&l, &a);
    CHECK_ERROR(mg_launch_run(b, k, NULL, &l), MG_ERR_INVALID_ARGUMENT, "argument 1: 96 bytes");
    a = good, a.v = v + 16;
    attention_args(&l, &a);
    CHECK_ERROR(mg_launch_run(b, k, NULL, &l), MG_ERR_INVALID_ARGUMENT, "argument 2:");
    a = good, a.o = o + 8;
    attention_args(&l, &a);
    CHECK_ERROR(mg_launch_run(b, k, NULL, &l), MG_ERR_INVALID_ARGUMENT, "argument 3 (0x");
    a = good, a.indptrs = ind + 8;
    attention_args(&l, &a);
    CHECK_ERROR(mg_launch_run(b, k, NULL, &l), MG_ERR_INVALID_ARGUMENT, "argument 5:");
    a = good, a.lse = lse + 4;
    attention_args(&l, &a);
    CHECK_ERROR(mg_launch_run(b, k, NULL, &l), MG_ERR_INVALID_ARGUMENT, "argument 4:");

    /* indptrs that decrease, do not start at 0, or run past the rows */
    static const int32_t bad_indptrs[][6] = {
        {0, 2, 1, 0, 3, 5}, {0, 2, 3, 0, 4, 3}, {1, 2, 3, 0, 3, 5},
        {0, 2, 3, 1, 3, 5}, {0, 2, 4, 0, 3, 5}, {0, 2, 3, 0, 3, 6},
    };
    static const char *const bad_needles[] = {"indptrs decrease at 1", "indptrs decrease at 1",
                                              "indptrs [1..3]",        "/ [1..5] outside",
                                              "indptrs [0..4]",        "[0..6] outside 3 / 5 rows"};
    for (size_t i = 0; i < sizeof bad_indptrs / sizeof bad_indptrs[0]; i++) {
        CHECK_OK(mg_copy_h2d(b, ind, bad_indptrs[i], sizeof bad_indptrs[i]));
        attention_args(&l, &good);
        CHECK_ERROR(mg_launch_run(b, k, NULL, &l), MG_ERR_INVALID_ARGUMENT, bad_needles[i]);
    }

    /* correct: all-ones values average to exactly 1.0; lse = log2(lk) + lk-independent score */
    CHECK_OK(mg_copy_h2d(b, ind, indptrs, sizeof indptrs));
    attention_args(&l, &good);
    CHECK_OK(mg_launch_run(b, k, NULL, &l));
    uint16_t out[48];
    float lse_out[6];
    CHECK_OK(mg_copy_d2h(b, out, o, sizeof out));
    CHECK_OK(mg_copy_d2h(b, lse_out, lse, sizeof lse_out));
    size_t wrong = 0;
    for (int i = 0; i < 48; i++)
        wrong += mg_bf16_to_f32(out[i]) != 1.0f;
    CHECK(wrong == 0);
    /* every score is q.k * sm_scale = 8 * 0.5 = 4 nats; lse (base 2) = log2(lk * e^4) */
    float want0 = (float)(log2(3.0) + 4.0 / log(2.0)), want2 = (float)(log2(2.0) + 4.0 / log(2.0));
    CHECK(fabsf(lse_out[0] - want0) < 1e-4f && fabsf(lse_out[1] - want0) < 1e-4f);
    CHECK(fabsf(lse_out[4] - want2) < 1e-4f && fabsf(lse_out[5] - want2) < 1e-4f);

    const mg_devptr all[] = {q, o, kk, v, lse, ind};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        CHECK_OK(mg_free(b, all[i]));
    CHECK_OK(mg_kernel_release(k));
}

static void test_registration(mg_backend *b) {
    CHECK_ERROR(mg_cpu_kernel_register("", "f", noop_kernel), MG_ERR_INVALID_ARGUMENT,
                "NULL or empty module name");
    CHECK_ERROR(mg_cpu_kernel_register("m", NULL, noop_kernel), MG_ERR_INVALID_ARGUMENT,
                "NULL or empty function name");
    CHECK_ERROR(mg_cpu_kernel_register("m", "f", NULL), MG_ERR_INVALID_ARGUMENT,
                "NULL kernel function");
    mg_kernel *k = NULL;
    CHECK_ERROR(mg_kernel_lookup(b, "m", "never_registered", &k), MG_ERR_NOT_FOUND,
                "no kernel \"never_registered\" in module \"m\"");
}

int main(void) {
    mg_backend *b = NULL;
    CHECK_OK(mg_backend_open(MG_BACKEND_CPU, 1, &b));
    if (!b)
        return test_finish();
    test_vector_add(b);
    test_gemm_bf16_kernel(b);
    test_gemm_fp8_kernel(b);
    test_scale_transpose_kernel(b);
    test_attention_kernel(b);
    test_registration(b);
    CHECK_OK(mg_backend_close(b));
    return test_finish();
}
