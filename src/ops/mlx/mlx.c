/* mlx.c - the MLX ops (metrale/mlx.h): every argument checked once, then the kernels of module
 * "metrale" launched by name with the same arguments on every backend (CUDA: first the
 * tensor-core GEMVs of kernels/cuda/mlx/mlx_gemv_mma.cu for BF16 scales, else the SIMT kernels
 * of mlx_quant.cu (its one-row kernels, provider cuda_m1, only when forced); CPU: mlx_reference.c,
 * or first the fast CPU providers of mlx_cpu_fast.c). The GEMM dequantizes into the caller's
 * scratch and calls mg_gemm_bf16. */
#include <stdio.h>

#include "cpu_isa.h"
#include "mlx_cpu_fast.h"

#include "backend_impl.h"
#include "error.h"
#include "metrale/launch.h"
#include "metrale/mlx.h"
#include "metrale/ops_gemm.h"
#include "mlx_reference.h"
#include "op_builtin.h"

/* CUDA launch shape, matched by the kernels: a GEMV block owns 16 rows (its threads are the
 * provider's: mlx_quant.cu 128, a warp per 4 rows; mlx_gemv_mma.cu 256, warps splitting K);
 * dequant blocks of 256 threads, a block per row. */
#define GEMV_ROWS_PER_BLOCK 16u
#define GEMV_THREADS_SIMT 128u
#define GEMV_THREADS_MMA 256u
#define DEQUANT_THREADS 256u
#define MAX_GRID 65535u

/* The tensor-core GEMVs (provider "cuda_mma"; CUDA only), with mlx_gemv's and
 * mlx_gemv_gate_up's argument lists. */
#define MG_MLX_KERNEL_GEMV_MMA "mlx_gemv_mma"
#define MG_MLX_KERNEL_GEMV_GATE_UP_MMA "mlx_gemv_gate_up_mma"

/* ------------------------------------------------------------------ checks */

typedef struct layer_ptrs {
    mg_devptr weight, scales, biases;
    mg_devptr bias; /* the expert's own bias, or 0 */
} layer_ptrs;

uint64_t mg_mlx_linear_bytes(const mg_mlx_linear *w) {
    if (!w || !w->bits || !w->group_size)
        return 0;
    return (uint64_t)w->n * w->k * w->bits / 8 + 2ull * 2 * w->n * (w->k / w->group_size);
}

uint64_t mg_mlx_gemm_scratch_bytes(const mg_mlx_linear *w) {
    return w ? (uint64_t)w->n * w->k * 2 : 0;
}

/* Room for the tensors of one call: two layers' buffers and four activations. */
#define MAX_TENSORS 12

/* The layer descriptor and the pointers of `expert`; appends the layer's buffers (the whole
 * expert stack: every expert's weights must lie inside them) to `t`. */
static mg_status check_layer(const char *fn, const char *which, const mg_mlx_linear *w,
                             uint32_t expert, layer_ptrs *out, mg_op_tensor *t, int *count) {
    if (!w)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: NULL %s", fn, which);
    if (w->bits != 4 && w->bits != 8)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: %s bits=%u (4 or 8)", fn, which, w->bits);
    if (w->group_size != 32 && w->group_size != 64 && w->group_size != 128)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: %s group_size=%u (32, 64 or 128)", fn, which,
                        w->group_size);
    if (!w->n || !w->k || w->k % w->group_size)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "%s: %s n=%u k=%u: both >= 1 and k a multiple of group_size=%u", fn, which,
                        w->n, w->k, w->group_size);
    if (w->scale_type != MG_DTYPE_BF16 && w->scale_type != MG_DTYPE_F16)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: %s scale_type %s (bf16 or f16)", fn, which,
                        mg_dtype_name(w->scale_type));
    if (!w->experts || expert >= w->experts)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: %s expert %u of %u", fn, which, expert,
                        w->experts);
    uint32_t bias_size = (uint32_t)mg_dtype_bytes(w->bias_type);
    if (w->bias && w->bias_type != MG_DTYPE_BF16 && w->bias_type != MG_DTYPE_F16 &&
        w->bias_type != MG_DTYPE_F32)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: %s bias_type %s (bf16, f16 or f32)", fn,
                        which, mg_dtype_name(w->bias_type));
    /* Per expert: n*k*bits/8 bytes of words (a multiple of 16: k % 32 == 0), 2 bytes per group. */
    uint64_t weight_bytes = (uint64_t)w->n * w->k * w->bits / 8;
    uint64_t group_bytes = 2ull * w->n * (w->k / w->group_size);
    t[(*count)++] = (mg_op_tensor){"weight", w->weight, weight_bytes * w->experts, 16, MG_OP_IN};
    t[(*count)++] = (mg_op_tensor){"scales", w->scales, group_bytes * w->experts, 2, MG_OP_IN};
    t[(*count)++] = (mg_op_tensor){"biases", w->biases, group_bytes * w->experts, 2, MG_OP_IN};
    t[(*count)++] = (mg_op_tensor){"bias", w->bias, (uint64_t)bias_size * w->n * w->experts,
                                   bias_size, MG_OP_IN | MG_OP_OPTIONAL};
    out->weight = w->weight + weight_bytes * expert;
    out->scales = w->scales + group_bytes * expert;
    out->biases = w->biases + group_bytes * expert;
    out->bias = w->bias ? w->bias + (uint64_t)bias_size * w->n * expert : 0;
    return MG_OK;
}

/* ------------------------------------------------------------------ provider */

/* A provider of the MLX ops: the kernels it launches, by role. "kernels" runs ours (the CUDA
 * backend's, or on the CPU backend the reference, mlx_reference.c); the fast CPU providers
 * (mlx_cpu_fast.h) come first on the CPU backend and launch their own kernels with the same
 * argument lists, except the bias add, which is the reference's on every provider. */
typedef struct mlx_provider {
    mg_op_provider base; /* first: the registry hands this back */
    const char *dequant, *gemv, *gate_up;
    uint32_t gemv_threads; /* threads of a GEMV block (the CPU kernels ignore the shape) */
} mlx_provider;

enum { KERNEL_DEQUANT, KERNEL_GEMV, KERNEL_GATE_UP, KERNEL_ADD_BIAS };

/* What a provider's supports hook sees: the layer and rows of a GEMV call (w NULL for dequant
 * and the bias add, which every provider runs). */
typedef struct mlx_call {
    const mg_mlx_linear *w;
    uint32_t m;
    bool silu; /* silu_gate or silu_gate_resid */
} mlx_call;

static const mlx_provider kernels_provider = {
    .base = MG_OP_KERNELS_PROVIDER(mg_mlx_cpu_kernels_register, MG_MLX_KERNEL_GEMV),
    .dequant = MG_MLX_KERNEL_DEQUANT,
    .gemv = MG_MLX_KERNEL_GEMV,
    .gate_up = MG_MLX_KERNEL_GEMV_GATE_UP,
    .gemv_threads = GEMV_THREADS_SIMT};

/* The fewest rows from which the automatic choice takes the tensor-core GEMVs for the plain
 * product and gate_up. Measured on an H100 (bench/results/2026-12-06-h100-mlx-mma.md, speed
 * relative to the SIMT kernels, which decode each weight once per row): at one row 0.73-0.94x
 * (gate_up 0.91-1.02x); at two 1.06-1.25x on every shape but 8-bit 14336x4096 (0.88x); at
 * four 1.5-2.7x; at eight 3.8-10.8x. The silu forms take them from one row (1.32-1.40x: their
 * activations are computed by the whole warp). Forced by name they run every M. */
#define MMA_MIN_M 2u

static const mlx_provider cuda_mma_provider;

/* The tensor-core GEMVs take BF16 scales (their decode is BF16 arithmetic, bit for bit the
 * dequant's); FP16 scales stay on the SIMT kernels ("kernels"). */
static bool mma_supports(mg_backend *b, const void *call, char *reason, size_t reason_bytes) {
    const mlx_call *c = call;
    if (!c || !c->w)
        return true;
    if (c->w->scale_type != MG_DTYPE_BF16) {
        snprintf(reason, reason_bytes, "scales %s (bf16 only)", mg_dtype_name(c->w->scale_type));
        return false;
    }
    if (!c->silu && c->m < MMA_MIN_M &&
        mg_op_forced(b, MG_OP_MLX_QUANT) != &cuda_mma_provider.base) {
        snprintf(reason, reason_bytes, "m=%u: the SIMT kernels are faster below %u rows", c->m,
                 MMA_MIN_M);
        return false;
    }
    return true;
}

/* First on CUDA: where it takes a call (above), faster than the SIMT kernels. */
static const mlx_provider cuda_mma_provider = {
    .base = {.name = "cuda_mma",
             .backend = MG_BACKEND_CUDA,
             .supports = mma_supports,
             .kernels = MG_OP_KERNEL_NAMES(MG_MLX_KERNEL_GEMV_MMA, MG_MLX_KERNEL_GEMV_GATE_UP_MMA,
                                           MG_MLX_KERNEL_DEQUANT, MG_MLX_KERNEL_ADD_BIAS)},
    .dequant = MG_MLX_KERNEL_DEQUANT,
    .gemv = MG_MLX_KERNEL_GEMV_MMA,
    .gate_up = MG_MLX_KERNEL_GEMV_GATE_UP_MMA,
    .gemv_threads = GEMV_THREADS_MMA};

/* The SIMT kernels compiled for one activation row (kernels/cuda/mlx/mlx_quant.cu: registers
 * for 7 or 8 blocks an SM where the kernels of every M hold 2 to 4): the plain GEMV and gate_up
 * (either epilogue) at m = 1; the silu forms stay on cuda_mma, which takes them from one row. */
#define MG_MLX_KERNEL_GEMV_M1 "mlx_gemv_m1"
#define MG_MLX_KERNEL_GEMV_GATE_UP_M1 "mlx_gemv_gate_up_m1"

static const mlx_provider cuda_m1_provider;

static bool m1_supports(mg_backend *b, const void *call, char *reason, size_t reason_bytes) {
    const mlx_call *c = call;
    if (!c || !c->w)
        return true;
    /* Not yet run on a GPU: the automatic choice passes it over until it is measured there
     * (bench/gpu_mlx_ab.sh); forced by name it runs. */
    if (mg_op_forced(b, MG_OP_MLX_QUANT) != &cuda_m1_provider.base) {
        snprintf(reason, reason_bytes, "only when forced (not yet measured on a GPU)");
        return false;
    }
    if (c->m != 1 || c->silu) {
        snprintf(reason, reason_bytes, "%s: one-row plain GEMVs and gate_up only",
                 c->silu ? "a silu form" : "m > 1");
        return false;
    }
    return true;
}

/* After cuda_mma (which passes over one-row plain GEMVs and gate_up): where it takes a call,
 * the same bits as "kernels". */
static const mlx_provider cuda_m1_provider = {
    .base = {.name = "cuda_m1",
             .backend = MG_BACKEND_CUDA,
             .supports = m1_supports,
             .kernels = MG_OP_KERNEL_NAMES(MG_MLX_KERNEL_GEMV_M1, MG_MLX_KERNEL_GEMV_GATE_UP_M1,
                                           MG_MLX_KERNEL_DEQUANT, MG_MLX_KERNEL_ADD_BIAS)},
    .dequant = MG_MLX_KERNEL_DEQUANT,
    .gemv = MG_MLX_KERNEL_GEMV_M1,
    .gate_up = MG_MLX_KERNEL_GEMV_GATE_UP_M1,
    .gemv_threads = GEMV_THREADS_SIMT};

static bool avx2_available(mg_backend *b, char *reason, size_t reason_bytes) {
    (void)b;
    return mg_mlx_cpu_avx2_built() && mg_cpu_avx2_available(reason, reason_bytes);
}

static const mlx_provider cpu_avx2_provider = {
    .base = {.name = "cpu_avx2",
             .backend = MG_BACKEND_CPU,
             .available = avx2_available,
             .register_cpu_kernels = mg_mlx_cpu_fast_kernels_register},
    .dequant = MG_MLX_KERNEL_DEQUANT_AVX2,
    .gemv = MG_MLX_KERNEL_GEMV_AVX2,
    .gate_up = MG_MLX_KERNEL_GEMV_GATE_UP_AVX2,
    .gemv_threads = GEMV_THREADS_SIMT};

static bool avx512_available(mg_backend *b, char *reason, size_t reason_bytes) {
    (void)b;
    return mg_mlx_cpu_avx2_built() && mg_cpu_avx512_available(reason, reason_bytes);
}

/* The GEMVs in 16 lanes, the dequant cpu_avx2's. Measured on a 2-core AMD EPYC with AVX-512
 * (bench/results/2026-12-04-cpu-smollm2-decode.md): 5-14% faster than cpu_avx2 per GEMV, 4% on
 * SmolLM2's decode step, so it comes first where the CPU has it. */
static const mlx_provider cpu_avx512_provider = {
    .base = {.name = "cpu_avx512",
             .backend = MG_BACKEND_CPU,
             .available = avx512_available,
             .register_cpu_kernels = mg_mlx_cpu_fast_kernels_register},
    .dequant = MG_MLX_KERNEL_DEQUANT_AVX2,
    .gemv = MG_MLX_KERNEL_GEMV_AVX512,
    .gate_up = MG_MLX_KERNEL_GEMV_GATE_UP_AVX512,
    .gemv_threads = GEMV_THREADS_SIMT};

/* The portable code is not yet faster than the reference (measured: bench cpu_fast), so the
 * automatic choice passes it over; forced by name it runs every call. */
static bool portable_supports(mg_backend *b, const void *call, char *reason, size_t reason_bytes);

static const mlx_provider cpu_portable_provider = {
    .base = {.name = "cpu_portable",
             .backend = MG_BACKEND_CPU,
             .supports = portable_supports,
             .register_cpu_kernels = mg_mlx_cpu_fast_kernels_register},
    .dequant = MG_MLX_KERNEL_DEQUANT_PORTABLE,
    .gemv = MG_MLX_KERNEL_GEMV_PORTABLE,
    .gate_up = MG_MLX_KERNEL_GEMV_GATE_UP_PORTABLE,
    .gemv_threads = GEMV_THREADS_SIMT};

static bool portable_supports(mg_backend *b, const void *call, char *reason, size_t reason_bytes) {
    (void)call;
    if (mg_op_forced(b, MG_OP_MLX_QUANT) == &cpu_portable_provider.base)
        return true;
    snprintf(reason, reason_bytes, "only when forced (not faster than the reference)");
    return false;
}

/* In order of preference; "kernels" last, so on the CPU backend the reference is reached by
 * forcing it (mg_op_force_provider(b, MG_OP_MLX_QUANT, "kernels")). */
static const mg_op_provider *const mlx_providers[] = {&cuda_mma_provider.base,
                                                      &cuda_m1_provider.base,
                                                      &cpu_avx512_provider.base,
                                                      &cpu_avx2_provider.base,
                                                      &cpu_portable_provider.base,
                                                      &kernels_provider.base,
                                                      NULL};

const mg_op_def mg_mlx_quant_op = {MG_OP_MLX_QUANT, "mlx_quant", mlx_providers};

/* The provider of a call on layer `w` with m rows, silu one of the silu forms (w NULL: dequant
 * or the bias add). */
static mg_status choose(mg_backend *b, const char *fn, const mg_mlx_linear *w, uint32_t m,
                        bool silu, const mlx_provider **out) {
    const mlx_call call = {w, m, silu};
    const mg_op_provider *chosen;
    mg_status st = mg_op_choose(b, MG_OP_MLX_QUANT, &call, fn, &chosen);
    if (!st)
        *out = (const mlx_provider *)chosen;
    return st;
}

/* Launches the kernel of `role` of provider p. */
static mg_status launch_role(mg_backend *b, mg_stream *s, const mlx_provider *p, int role,
                             mg_launch *l) {
    const char *kernel = role == KERNEL_DEQUANT   ? p->dequant
                         : role == KERNEL_GEMV    ? p->gemv
                         : role == KERNEL_GATE_UP ? p->gate_up
                                                  : MG_MLX_KERNEL_ADD_BIAS;
    mg_status st = mg_op_launch_kernels(b, s, &kernel, l, 1);
    if (st)
        return st;
    mg_op_count_call(b, MG_OP_MLX_QUANT, &p->base, false);
    return MG_OK;
}

/* Dequant and the bias add: the same kernel on every provider of a backend. */
static mg_status launch(mg_backend *b, mg_stream *s, const char *fn, int role, mg_launch *l) {
    const mlx_provider *p;
    mg_status st = choose(b, fn, NULL, 0, false, &p);
    return st ? st : launch_role(b, s, p, role, l);
}

static void add_layer_args(mg_launch *l, const layer_ptrs *p) {
    mg_launch_arg_ptr(l, p->weight);
    mg_launch_arg_ptr(l, p->scales);
    mg_launch_arg_ptr(l, p->biases);
}

static void add_shape_args(mg_launch *l, const mg_mlx_linear *w) {
    mg_launch_arg_u32(l, w->n);
    mg_launch_arg_u32(l, w->k);
    mg_launch_arg_u32(l, w->bits);
    mg_launch_arg_u32(l, w->group_size);
    mg_launch_arg_u32(l, w->scale_type == MG_DTYPE_F16 ? MG_MLX_SCALE_F16 : MG_MLX_SCALE_BF16);
}

/* y[m, n] += bias[n] (metrale/mlx.h), on `s` after whatever was queued before. */
static mg_status launch_add_bias(mg_backend *b, mg_stream *s, const char *fn, mg_devptr y,
                                 mg_devptr bias, uint32_t m, uint32_t n, mg_dtype bias_type) {
    uint64_t total = (uint64_t)m * n, blocks = (total + 255) / 256;
    mg_launch l;
    mg_launch_init(&l, (mg_dim3){blocks < MAX_GRID ? (uint32_t)blocks : MAX_GRID, 1, 1},
                   (mg_dim3){256, 1, 1}, 0);
    mg_launch_arg_ptr(&l, y);
    mg_launch_arg_ptr(&l, bias);
    mg_launch_arg_u32(&l, m);
    mg_launch_arg_u32(&l, n);
    mg_launch_arg_u32(&l, bias_type == MG_DTYPE_F32   ? MG_MLX_BIAS_F32
                          : bias_type == MG_DTYPE_F16 ? MG_MLX_BIAS_F16
                                                      : MG_MLX_BIAS_BF16);
    return launch(b, s, fn, KERNEL_ADD_BIAS, &l);
}

/* y[m, n] += the layer's bias (metrale/mlx.h), after the product on the same stream; nothing
 * for a layer without one. */
static mg_status add_bias(mg_backend *b, mg_stream *s, const char *fn, const mg_mlx_linear *w,
                          const layer_ptrs *p, uint32_t m, mg_devptr y) {
    if (!p->bias)
        return MG_OK;
    return launch_add_bias(b, s, fn, y, p->bias, m, w->n, w->bias_type);
}

mg_status mg_mlx_add_bias(mg_backend *b, mg_stream *s, uint32_t m, uint32_t n, mg_devptr y,
                          mg_devptr bias, mg_dtype bias_type) {
    static const char fn[] = "mg_mlx_add_bias";
    mg_status st = mg_op_enter(b, fn);
    if (st)
        return st;
    if (!m || !n)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: m=%u n=%u (both >= 1)", fn, m, n);
    if (bias_type != MG_DTYPE_BF16 && bias_type != MG_DTYPE_F16 && bias_type != MG_DTYPE_F32)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: bias_type %s (bf16, f16 or f32)", fn,
                        mg_dtype_name(bias_type));
    const mg_op_tensor t[] = {
        {"y", y, mg_op_matrix_bytes(m, n, n, 2), 2, MG_OP_OUT},
        {"bias", bias, mg_op_matrix_bytes(1, n, n, mg_dtype_bytes(bias_type)),
         (uint32_t)mg_dtype_bytes(bias_type), MG_OP_IN},
    };
    if ((st = mg_op_check_tensors(b, fn, t, 2, -1, -1)))
        return st;
    return launch_add_bias(b, s, fn, y, bias, m, n, bias_type);
}

/* ------------------------------------------------------------------ dequant */

static mg_status dequant(mg_backend *b, mg_stream *s, const char *fn, const mg_mlx_linear *w,
                         const layer_ptrs *p, mg_devptr out) {
    /* A block per row (grid-stride over rows), a thread per 16-byte vector of the row. */
    mg_launch l;
    mg_launch_init(&l, (mg_dim3){w->n < MAX_GRID ? w->n : MAX_GRID, 1, 1},
                   (mg_dim3){DEQUANT_THREADS, 1, 1}, 0);
    add_layer_args(&l, p);
    mg_launch_arg_ptr(&l, out);
    add_shape_args(&l, w);
    return launch(b, s, fn, KERNEL_DEQUANT, &l);
}

mg_status mg_mlx_dequant(mg_backend *b, mg_stream *s, const mg_mlx_linear *w, uint32_t expert,
                         mg_devptr out) {
    static const char fn[] = "mg_mlx_dequant";
    layer_ptrs p;
    mg_op_tensor t[MAX_TENSORS];
    int count = 0;
    mg_status st = mg_op_enter(b, fn);
    if (st || (st = check_layer(fn, "w", w, expert, &p, t, &count)))
        return st;
    t[count++] = (mg_op_tensor){"out", out, mg_mlx_gemm_scratch_bytes(w), 16, MG_OP_OUT};
    if ((st = mg_op_check_tensors(b, fn, t, count, -1, -1)))
        return st;
    return dequant(b, s, fn, w, &p, out);
}

/* ------------------------------------------------------------------ GEMVs */

static mg_dim3 gemv_grid(uint32_t n) {
    uint32_t blocks = (n + GEMV_ROWS_PER_BLOCK - 1) / GEMV_ROWS_PER_BLOCK;
    return (mg_dim3){blocks, 1, 1};
}

/* m within the GEMVs' limit. */
static mg_status check_gemv_rows(const char *fn, uint32_t m) {
    if (m == 0 || m > MG_MLX_GEMV_MAX_M)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: m=%u (1 to %u; mg_mlx_gemm takes any m)", fn,
                        m, MG_MLX_GEMV_MAX_M);
    return MG_OK;
}

static mg_status gemv(mg_backend *b, mg_stream *s, const char *fn, const mg_mlx_linear *w,
                      uint32_t expert, uint32_t m, mg_devptr x, mg_devptr u, mg_devptr resid,
                      mg_devptr y, uint32_t mode) {
    layer_ptrs p;
    mg_op_tensor t[MAX_TENSORS];
    int count = 0;
    mg_status st = mg_op_enter(b, fn);
    if (st || (st = check_layer(fn, "w", w, expert, &p, t, &count)) ||
        (st = check_gemv_rows(fn, m)))
        return st;
    /* resid may be y itself (the residual stream updated in place), nothing else may overlap
     * y. */
    bool gated = mode != MG_MLX_GEMV_PLAIN, with_resid = mode == MG_MLX_GEMV_SILU_GATE_RESID;
    t[count++] = (mg_op_tensor){gated ? "g" : "x", x, 2ull * m * w->k, 16, MG_OP_IN};
    if (gated)
        t[count++] = (mg_op_tensor){"u", u, 2ull * m * w->k, 16, MG_OP_IN};
    if (with_resid)
        t[count++] = (mg_op_tensor){"resid", resid, 2ull * m * w->n, 2, MG_OP_IN};
    t[count++] = (mg_op_tensor){"y", y, 2ull * m * w->n, 2, MG_OP_OUT};
    if ((st = mg_op_check_tensors(b, fn, t, count, with_resid ? count - 2 : -1, count - 1)))
        return st;
    const mlx_provider *provider;
    if ((st = choose(b, fn, w, m, gated, &provider)))
        return st;
    mg_launch l;
    mg_launch_init(&l, gemv_grid(w->n), (mg_dim3){provider->gemv_threads, 1, 1}, 0);
    add_layer_args(&l, &p);
    mg_launch_arg_ptr(&l, x);
    mg_launch_arg_ptr(&l, mode ? u : x);                                    /* unused when plain */
    mg_launch_arg_ptr(&l, mode == MG_MLX_GEMV_SILU_GATE_RESID ? resid : y); /* unused without */
    mg_launch_arg_ptr(&l, y);
    mg_launch_arg_u32(&l, m);
    add_shape_args(&l, w);
    mg_launch_arg_u32(&l, mode);
    if ((st = launch_role(b, s, provider, KERNEL_GEMV, &l)))
        return st;
    return add_bias(b, s, fn, w, &p, m, y);
}

mg_status mg_mlx_gemv(mg_backend *b, mg_stream *s, const mg_mlx_linear *w, uint32_t expert,
                      uint32_t m, mg_devptr x, mg_devptr y) {
    return gemv(b, s, "mg_mlx_gemv", w, expert, m, x, 0, 0, y, MG_MLX_GEMV_PLAIN);
}

mg_status mg_mlx_gemv_silu_gate(mg_backend *b, mg_stream *s, const mg_mlx_linear *w,
                                uint32_t expert, uint32_t m, mg_devptr g, mg_devptr u,
                                mg_devptr y) {
    return gemv(b, s, "mg_mlx_gemv_silu_gate", w, expert, m, g, u, 0, y, MG_MLX_GEMV_SILU_GATE);
}

mg_status mg_mlx_gemv_silu_gate_resid(mg_backend *b, mg_stream *s, const mg_mlx_linear *w,
                                      uint32_t expert, uint32_t m, mg_devptr g, mg_devptr u,
                                      mg_devptr resid, mg_devptr y) {
    return gemv(b, s, "mg_mlx_gemv_silu_gate_resid", w, expert, m, g, u, resid, y,
                MG_MLX_GEMV_SILU_GATE_RESID);
}

/* gate_up with `epilogue` (mlx_reference.h): y_up is 0 with MG_MLX_GATE_UP_SILU_MUL, whose
 * caller has refused layers with a bias (it would be added after the SiLU-mul). */
static mg_status gate_up(mg_backend *b, mg_stream *s, const char *fn, const mg_mlx_linear *gate,
                         const mg_mlx_linear *up, uint32_t expert, uint32_t m, mg_devptr x,
                         mg_devptr y_gate, mg_devptr y_up, uint32_t epilogue) {
    layer_ptrs pg, pu;
    mg_op_tensor t[MAX_TENSORS];
    int count = 0;
    mg_status st = mg_op_enter(b, fn);
    if (st || (st = check_layer(fn, "gate", gate, expert, &pg, t, &count)) ||
        (st = check_layer(fn, "up", up, expert, &pu, t, &count)))
        return st;
    if (gate->n != up->n || gate->k != up->k || gate->bits != up->bits ||
        gate->group_size != up->group_size || gate->scale_type != up->scale_type)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "%s: gate and up differ in shape or format (n %u/%u, k %u/%u, bits "
                        "%u/%u, group_size %u/%u)",
                        fn, gate->n, up->n, gate->k, up->k, gate->bits, up->bits, gate->group_size,
                        up->group_size);
    if ((st = check_gemv_rows(fn, m)))
        return st;
    const bool both = epilogue == MG_MLX_GATE_UP_BOTH;
    t[count++] = (mg_op_tensor){"x", x, 2ull * m * gate->k, 16, MG_OP_IN};
    t[count++] = (mg_op_tensor){both ? "y_gate" : "y", y_gate, 2ull * m * gate->n, 2, MG_OP_OUT};
    if (both)
        t[count++] = (mg_op_tensor){"y_up", y_up, 2ull * m * gate->n, 2, MG_OP_OUT};
    if ((st = mg_op_check_tensors(b, fn, t, count, -1, -1)))
        return st;
    const mlx_provider *provider;
    if ((st = choose(b, fn, gate, m, false, &provider)))
        return st;
    mg_launch l;
    mg_launch_init(&l, gemv_grid(gate->n), (mg_dim3){provider->gemv_threads, 1, 1}, 0);
    add_layer_args(&l, &pg);
    add_layer_args(&l, &pu);
    mg_launch_arg_ptr(&l, x);
    mg_launch_arg_ptr(&l, y_gate);
    mg_launch_arg_ptr(&l, both ? y_up : y_gate); /* not read by the SiLU-mul form */
    mg_launch_arg_u32(&l, m);
    add_shape_args(&l, gate);
    mg_launch_arg_u32(&l, epilogue);
    if ((st = launch_role(b, s, provider, KERNEL_GATE_UP, &l)) || !both ||
        (st = add_bias(b, s, fn, gate, &pg, m, y_gate)))
        return st;
    return add_bias(b, s, fn, up, &pu, m, y_up);
}

mg_status mg_mlx_gemv_gate_up(mg_backend *b, mg_stream *s, const mg_mlx_linear *gate,
                              const mg_mlx_linear *up, uint32_t expert, uint32_t m, mg_devptr x,
                              mg_devptr y_gate, mg_devptr y_up) {
    return gate_up(b, s, "mg_mlx_gemv_gate_up", gate, up, expert, m, x, y_gate, y_up,
                   MG_MLX_GATE_UP_BOTH);
}

mg_status mg_mlx_gemv_fused(mg_backend *b, mg_stream *s, const mg_mlx_linear *w,
                            const mg_mlx_linear *up, uint32_t expert, uint32_t m, mg_devptr x,
                            mg_devptr y, const mg_gemm_fusion *fusion,
                            const mg_gemm_fusion_tensors *tensors) {
    static const char fn[] = "mg_mlx_gemv_fused";
    mg_status st = mg_op_enter(b, fn);
    if (st)
        return st;
    if (!fusion || !tensors)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: NULL %s", fn, fusion ? "tensors" : "fusion");
    const char *prologue = mg_gemm_prologue_name(fusion->prologue);
    const char *epilogue = mg_gemm_epilogue_name(fusion->epilogue);
    if (!prologue || !epilogue)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "%s: fusion prologue %d epilogue %d (no such kind)", fn,
                        (int)fusion->prologue, (int)fusion->epilogue);
    /* every fusion tensor belongs to a fusion these GEMVs do not run (below): none may be given */
    const char *given = tensors->norm_weight  ? "norm_weight"
                        : tensors->residual   ? "residual"
                        : tensors->argmax_ids ? "argmax_ids"
                        : tensors->kv_cache   ? "kv_cache"
                        : tensors->kv_append  ? "kv_append"
                                              : NULL;
    if (fusion->prologue != MG_GEMM_PROLOGUE_NONE)
        return MG_ERROR(MG_ERR_UNSUPPORTED, "%s: prologue %s: the MLX GEMVs have no prologue", fn,
                        prologue);
    if (fusion->epilogue != MG_GEMM_EPILOGUE_NONE && fusion->epilogue != MG_GEMM_EPILOGUE_SILU_MUL)
        return MG_ERROR(MG_ERR_UNSUPPORTED,
                        "%s: epilogue %s: the MLX GEMVs run only silu_mul (gate_up form)", fn,
                        epilogue);
    if (given)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "%s: tensors->%s given, which epilogue %s does not read", fn, given,
                        epilogue);
    const bool silu_mul = fusion->epilogue == MG_GEMM_EPILOGUE_SILU_MUL;
    if (silu_mul != (up != NULL))
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        silu_mul ? "%s: epilogue silu_mul needs the up layer (gate_up form)"
                                 : "%s: an up layer needs epilogue silu_mul (or call "
                                   "mg_mlx_gemv_gate_up)",
                        fn);
    if (!silu_mul)
        return gemv(b, s, fn, w, expert, m, x, 0, 0, y, MG_MLX_GEMV_PLAIN);
    if (w && up && (w->bias || up->bias))
        return MG_ERROR(MG_ERR_UNSUPPORTED,
                        "%s: the %s layer has a bias of its own, which the SiLU-mul form does not "
                        "add (mg_mlx_gemv_gate_up, then mg_silu_mul_bf16, does)",
                        fn, w->bias ? "gate" : "up");
    return gate_up(b, s, fn, w, up, expert, m, x, y, 0, MG_MLX_GATE_UP_SILU_MUL);
}

/* ------------------------------------------------------------------ GEMM */

mg_status mg_mlx_gemm(mg_backend *b, mg_stream *s, const mg_mlx_linear *w, uint32_t expert,
                      uint32_t m, mg_devptr x, mg_devptr y, mg_devptr scratch) {
    static const char fn[] = "mg_mlx_gemm";
    layer_ptrs p;
    mg_op_tensor t[MAX_TENSORS];
    int count = 0;
    mg_status st = mg_op_enter(b, fn);
    if (st || (st = check_layer(fn, "w", w, expert, &p, t, &count)))
        return st;
    if (!m)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: m=0", fn);
    /* The scratch receives the dequantized weight, then is read by the GEMM: an output. */
    t[count++] = (mg_op_tensor){"scratch", scratch, mg_mlx_gemm_scratch_bytes(w), 16, MG_OP_OUT};
    t[count++] = (mg_op_tensor){"x", x, 2ull * m * w->k, 2, MG_OP_IN};
    t[count++] = (mg_op_tensor){"y", y, 2ull * m * w->n, 2, MG_OP_OUT};
    if ((st = mg_op_check_tensors(b, fn, t, count, -1, -1)))
        return st;
    if ((st = dequant(b, s, fn, w, &p, scratch)) ||
        (st = mg_gemm_bf16(b, s, m, w->n, w->k, x, scratch, y, MG_DTYPE_BF16, w->n)))
        return st;
    return add_bias(b, s, fn, w, &p, m, y);
}
