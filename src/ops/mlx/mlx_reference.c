/* mlx_reference.c - the CPU reference of the MLX ops (mlx_reference.h, metrale/mlx.h), run by
 * the CPU backend as the kernels mlx_dequant, mlx_gemv, mlx_gemv_gate_up and mlx_add_bias. The
 * GEMVs accumulate in double: they define the result the CUDA kernels' FP32 sums approximate. */
#include "mlx_reference.h"

#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_kernels.h"
#include "error.h"
#include "host_parallel.h"
#include "metrale/dtype.h"
#include "metrale/launch.h"
#include "silu_mul_host.h"

/* ------------------------------------------------------------------ FP16 */

static float f16_to_f32(uint16_t h) {
    /* exact: normal values by moving the fields, subnormals as man * 2^-24 (a product by a
     * power of two), infinities kept, every NaN the quiet NaN of its sign */
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    uint32_t bits;
    float v;
    if (exp == 0) {
        v = (float)man * 5.9604644775390625e-08f;
        memcpy(&bits, &v, 4);
        bits |= sign;
    } else if (exp == 31) {
        bits = sign | (man ? 0x7fc00000u : 0x7f800000u);
    } else {
        bits = sign | (exp + 112u) << 23 | man << 13;
    }
    memcpy(&v, &bits, 4);
    return v;
}

/* Round to nearest even, overflow to infinity, NaN kept (quiet). */
static uint16_t f32_to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    float a = fabsf(f);
    if (isnan(f))
        return sign | 0x7e00u;
    if (a >= 65520.0f) /* rounds to infinity */
        return sign | 0x7c00u;
    if (a < 6.103515625e-05f) { /* subnormal range: units of 2^-24, rint is nearest-even */
        float units = rintf(a * 16777216.0f);
        return sign | (uint16_t)units;
    }
    uint32_t ax;
    memcpy(&ax, &a, 4);
    uint32_t exp = (ax >> 23) - 127 + 15, man = ax & 0x7fffffu;
    uint32_t h = exp << 10 | man >> 13, rest = man & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1)))
        h++; /* a carry into the exponent is the right result */
    return sign | (uint16_t)h;
}

static float scale_to_f32(const uint16_t *p, uint32_t scale_type, size_t i) {
    return scale_type == MG_MLX_SCALE_F16 ? f16_to_f32(p[i]) : mg_bf16_to_f32(p[i]);
}

/* x rounded to the scales' type (and back). */
static float round_to_scale_type(float x, uint32_t scale_type) {
    return scale_type == MG_MLX_SCALE_F16 ? f16_to_f32(f32_to_f16(x))
                                          : mg_bf16_to_f32(mg_f32_to_bf16(x));
}

/* ------------------------------------------------------------------ layer access */

typedef mg_mlx_cpu_layer layer;

static uint32_t code(const layer *w, uint32_t row, uint32_t j) {
    uint32_t per_word = 32 / w->bits;
    uint32_t word = w->weight[(size_t)row * (w->k / per_word) + j / per_word];
    return (word >> ((j % per_word) * w->bits)) & ((1u << w->bits) - 1);
}

static size_t group_index(const layer *w, uint32_t row, uint32_t j) {
    return (size_t)row * (w->k / w->group_size) + j / w->group_size;
}

typedef struct dequant_job {
    const layer *w;
    uint16_t *out;
} dequant_job;

/* Rows [first, first + count): each group's 2^bits possible outputs are computed once (the
 * same rounding as element by element), then looked up by code. */
static void dequant_rows(void *ctx, size_t first, size_t count) {
    const dequant_job *d = ctx;
    const layer *w = d->w;
    const uint32_t values = 1u << w->bits;
    uint16_t table[256];
    for (size_t r = first; r < first + count; r++)
        for (uint32_t j0 = 0; j0 < w->k; j0 += w->group_size) {
            const size_t g = group_index(w, (uint32_t)r, j0);
            const float scale = scale_to_f32(w->scales, w->scale_type, g);
            const float bias = scale_to_f32(w->biases, w->scale_type, g);
            const bool use_table = w->group_size >= values;
            for (uint32_t q = 0; use_table && q < values; q++) {
                const float t = round_to_scale_type(scale * (float)q, w->scale_type);
                table[q] = mg_f32_to_bf16(round_to_scale_type(t + bias, w->scale_type));
            }
            for (uint32_t j = j0; j < j0 + w->group_size; j++) {
                const uint32_t q = code(w, (uint32_t)r, j);
                uint16_t v;
                if (use_table) {
                    v = table[q];
                } else {
                    const float t = round_to_scale_type(scale * (float)q, w->scale_type);
                    v = mg_f32_to_bf16(round_to_scale_type(t + bias, w->scale_type));
                }
                d->out[r * w->k + j] = v;
            }
        }
}

static void dequant(const layer *w, uint16_t *out) {
    dequant_job d = {.w = w, .out = out};
    mg_host_parallel_for(w->n, (size_t)((1u << 16) / w->k + 1), dequant_rows, &d);
}

static float silu_gate_value(uint16_t g, uint16_t u) {
    return mg_bf16_to_f32(mg_silu_mul_reference_one(g, u));
}

/* y[m, n] = act · Wᵀ (+ resid): act is x, or silu(x) * u rounded to BF16 when `u` is set.
 * Per output: sum over groups in order of scale * qx + bias * xs, where qx = sum of code * act
 * and xs = sum of act over the group's elements in order, all in double. The activations and
 * xs depend on the row only through nothing, so they are computed once per token row; GEMV_ROWS
 * weight rows are summed side by side (independent chains), each in the order above, so the
 * result is the same for any blocking and thread count. */
#define GEMV_ROWS 4 /* gemv_rows names its four chains */

typedef struct gemv_job {
    const layer *w;
    uint32_t m;
    const double *act; /* [m, k] */
    const double *xs;  /* [m, k / group_size] */
    const uint16_t *resid;
    uint16_t *y;
} gemv_job;

/* The codes of elements j0 .. j0 + gs - 1 of `row` into out[j * GEMV_ROWS] (whole words: gs
 * is a multiple of 32 and so of the codes per word). */
static void row_codes(const layer *w, uint32_t row, uint32_t j0, uint32_t gs, double *out) {
    const uint32_t per_word = 32 / w->bits, mask = (1u << w->bits) - 1;
    const uint32_t *words = w->weight + (size_t)row * (w->k / per_word) + j0 / per_word;
    for (uint32_t wi = 0; wi < gs / per_word; wi++) {
        const uint32_t word = words[wi];
        for (uint32_t c = 0; c < per_word; c++)
            out[(size_t)(wi * per_word + c) * GEMV_ROWS] = (double)((word >> (c * w->bits)) & mask);
    }
}

static void gemv_rows(void *ctx, size_t first, size_t count) {
    const gemv_job *g = ctx;
    const layer *w = g->w;
    const uint32_t k = w->k, gs = w->group_size, groups = k / gs, m = g->m;
    double codes[128 * GEMV_ROWS]; /* [j][r] */
    double sum[MG_MLX_GEMV_MAX_M][GEMV_ROWS];
    for (size_t r0 = first; r0 < first + count; r0 += GEMV_ROWS) {
        const uint32_t rows =
            first + count - r0 < GEMV_ROWS ? (uint32_t)(first + count - r0) : GEMV_ROWS;
        memset(sum, 0, sizeof sum);
        for (uint32_t grp = 0; grp < groups; grp++) {
            const uint32_t j0 = grp * gs;
            for (uint32_t r = 0; r < GEMV_ROWS; r++)
                row_codes(w, (uint32_t)r0 + (r < rows ? r : 0), j0, gs, codes + r);
            double scale[GEMV_ROWS], bias[GEMV_ROWS];
            for (uint32_t r = 0; r < rows; r++) {
                const size_t gi = group_index(w, (uint32_t)r0 + r, j0);
                scale[r] = scale_to_f32(w->scales, w->scale_type, gi);
                bias[r] = scale_to_f32(w->biases, w->scale_type, gi);
            }
            for (uint32_t t = 0; t < m; t++) {
                const double *a = g->act + (size_t)t * k + j0;
                double q0 = 0, q1 = 0, q2 = 0, q3 = 0; /* GEMV_ROWS chains, in registers */
                for (uint32_t j = 0; j < gs; j++) {
                    const double *c = codes + j * GEMV_ROWS, x = a[j];
                    q0 += c[0] * x;
                    q1 += c[1] * x;
                    q2 += c[2] * x;
                    q3 += c[3] * x;
                }
                const double qx[GEMV_ROWS] = {q0, q1, q2, q3};
                const double xs = g->xs[(size_t)t * groups + grp];
                for (uint32_t r = 0; r < rows; r++)
                    sum[t][r] += scale[r] * qx[r] + bias[r] * xs;
            }
        }
        for (uint32_t t = 0; t < m; t++)
            for (uint32_t r = 0; r < rows; r++) {
                const size_t o = (size_t)t * w->n + r0 + r;
                double v = sum[t][r];
                if (g->resid)
                    v += mg_bf16_to_f32(g->resid[o]);
                g->y[o] = mg_f32_to_bf16((float)v);
            }
    }
}

static void gemv_blocks(void *ctx, size_t first, size_t count) {
    const gemv_job *g = ctx;
    const size_t lo = first * GEMV_ROWS, hi = (first + count) * GEMV_ROWS;
    gemv_rows(ctx, lo, (hi < g->w->n ? hi : g->w->n) - lo);
}

static mg_status gemv(const layer *w, uint32_t m, const uint16_t *x, const uint16_t *u,
                      const uint16_t *resid, uint16_t *y) {
    const uint32_t groups = w->k / w->group_size;
    double *act = malloc((size_t)m * w->k * sizeof *act);
    double *xs = malloc((size_t)m * groups * sizeof *xs);
    if (!act || !xs) {
        free(act);
        free(xs);
        return MG_ERROR(MG_ERR_OUT_OF_MEMORY, "cpu kernel mlx_gemv: no host memory");
    }
    for (uint32_t t = 0; t < m; t++)
        for (uint32_t grp = 0; grp < groups; grp++) {
            double sum = 0;
            for (uint32_t j = grp * w->group_size; j < (grp + 1) * w->group_size; j++) {
                const size_t i = (size_t)t * w->k + j;
                const double a = u ? silu_gate_value(x[i], u[i]) : mg_bf16_to_f32(x[i]);
                act[i] = a;
                sum += a;
            }
            xs[(size_t)t * groups + grp] = sum;
        }
    gemv_job g = {.w = w, .m = m, .act = act, .xs = xs, .resid = resid, .y = y};
    /* parts of whole GEMV_ROWS blocks, at least 2^16 multiply-adds each */
    const size_t blocks = (w->n + GEMV_ROWS - 1) / GEMV_ROWS;
    const uint64_t per_block = (uint64_t)GEMV_ROWS * w->k * m;
    mg_host_parallel_for(blocks, (size_t)((1u << 16) / per_block + 1), gemv_blocks, &g);
    free(act);
    free(xs);
    return MG_OK;
}

/* ------------------------------------------------------------------ CPU kernels */

/* Resolves a layer's three buffers (arguments first .. first + 2) and its shape arguments
 * (n, k, bits, group_size, scale_type at shape_first), checking them as the front does, so a
 * bad launch is an error naming the kernel, never an out-of-bounds access. */
static mg_status resolve_layer(const mg_launch *l, uint32_t first, uint32_t shape_first,
                               const char *name, layer *w) {
    w->n = mg_launch_get_u32(l, shape_first);
    w->k = mg_launch_get_u32(l, shape_first + 1);
    w->bits = mg_launch_get_u32(l, shape_first + 2);
    w->group_size = mg_launch_get_u32(l, shape_first + 3);
    w->scale_type = mg_launch_get_u32(l, shape_first + 4);
    if ((w->bits != 4 && w->bits != 8) ||
        (w->group_size != 32 && w->group_size != 64 && w->group_size != 128) ||
        w->k % w->group_size || w->scale_type > MG_MLX_SCALE_F16)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "cpu kernel %s: bad layer n=%u k=%u bits=%u group_size=%u scale_type=%u",
                        name, w->n, w->k, w->bits, w->group_size, w->scale_type);
    uint64_t words = (uint64_t)w->n * w->k / (32 / w->bits);
    uint64_t groups = (uint64_t)w->n * (w->k / w->group_size);
    void *p[3];
    mg_status st;
    if ((st = mg_cpu_kernel_buffer(l, first, words * 4, 16, name, &p[0])) ||
        (st = mg_cpu_kernel_buffer(l, first + 1, groups * 2, 2, name, &p[1])) ||
        (st = mg_cpu_kernel_buffer(l, first + 2, groups * 2, 2, name, &p[2])))
        return st;
    w->weight = p[0];
    w->scales = p[1];
    w->biases = p[2];
    return MG_OK;
}

mg_status mg_mlx_cpu_dequant_args(const mg_launch *l, const char *name, mg_mlx_cpu_layer *w,
                                  uint16_t **out) {
    static const mg_arg_kind kinds[] = {MG_ARG_BUFFER, MG_ARG_BUFFER, MG_ARG_BUFFER,
                                        MG_ARG_BUFFER, MG_ARG_U32,    MG_ARG_U32,
                                        MG_ARG_U32,    MG_ARG_U32,    MG_ARG_U32};
    mg_status st = mg_cpu_kernel_check_args(l, name, kinds, 9);
    void *p;
    if (st || (st = resolve_layer(l, 0, 4, name, w)) ||
        (st = mg_cpu_kernel_buffer(l, 3, (uint64_t)w->n * w->k * 2, 16, name, &p)))
        return st;
    *out = p;
    return MG_OK;
}

mg_status mg_mlx_cpu_gemv_args(const mg_launch *l, const char *name, mg_mlx_cpu_layer *w,
                               uint32_t *m, const uint16_t **x, const uint16_t **u,
                               const uint16_t **resid, uint16_t **y) {
    static const mg_arg_kind kinds[] = {MG_ARG_BUFFER, MG_ARG_BUFFER, MG_ARG_BUFFER, MG_ARG_BUFFER,
                                        MG_ARG_BUFFER, MG_ARG_BUFFER, MG_ARG_BUFFER, MG_ARG_U32,
                                        MG_ARG_U32,    MG_ARG_U32,    MG_ARG_U32,    MG_ARG_U32,
                                        MG_ARG_U32,    MG_ARG_U32};
    mg_status st = mg_cpu_kernel_check_args(l, name, kinds, 14);
    if (st)
        return st;
    const uint32_t mode = mg_launch_get_u32(l, 13);
    *m = mg_launch_get_u32(l, 7);
    if ((st = resolve_layer(l, 0, 8, name, w)))
        return st;
    if (*m == 0 || *m > MG_MLX_GEMV_MAX_M || mode > MG_MLX_GEMV_SILU_GATE_RESID)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "cpu kernel %s: m=%u mode=%u", name, *m, mode);
    const uint64_t act_bytes = (uint64_t)*m * w->k * 2, out_bytes = (uint64_t)*m * w->n * 2;
    void *px, *pu = NULL, *pr = NULL, *py;
    if ((st = mg_cpu_kernel_buffer(l, 3, act_bytes, 16, name, &px)) ||
        (mode != MG_MLX_GEMV_PLAIN &&
         (st = mg_cpu_kernel_buffer(l, 4, act_bytes, 16, name, &pu))) ||
        (mode == MG_MLX_GEMV_SILU_GATE_RESID &&
         (st = mg_cpu_kernel_buffer(l, 5, out_bytes, 2, name, &pr))) ||
        (st = mg_cpu_kernel_buffer(l, 6, out_bytes, 2, name, &py)))
        return st;
    *x = px;
    *u = pu;
    *resid = pr;
    *y = py;
    return MG_OK;
}

mg_status mg_mlx_cpu_gate_up_args(const mg_launch *l, const char *name, mg_mlx_cpu_layer w[2],
                                  uint32_t *m, const uint16_t **x, uint16_t **y1, uint16_t **y2,
                                  uint32_t *epilogue) {
    static const mg_arg_kind kinds[] = {MG_ARG_BUFFER, MG_ARG_BUFFER, MG_ARG_BUFFER, MG_ARG_BUFFER,
                                        MG_ARG_BUFFER, MG_ARG_BUFFER, MG_ARG_BUFFER, MG_ARG_BUFFER,
                                        MG_ARG_BUFFER, MG_ARG_U32,    MG_ARG_U32,    MG_ARG_U32,
                                        MG_ARG_U32,    MG_ARG_U32,    MG_ARG_U32,    MG_ARG_U32};
    mg_status st = mg_cpu_kernel_check_args(l, name, kinds, 16);
    if (st)
        return st;
    *m = mg_launch_get_u32(l, 9);
    *epilogue = mg_launch_get_u32(l, 15);
    if ((st = resolve_layer(l, 0, 10, name, &w[0])) || (st = resolve_layer(l, 3, 10, name, &w[1])))
        return st;
    if (*m == 0 || *m > MG_MLX_GEMV_MAX_M || *epilogue > MG_MLX_GATE_UP_SILU_MUL)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "cpu kernel %s: m=%u epilogue=%u", name, *m,
                        *epilogue);
    const uint64_t out_bytes = (uint64_t)*m * w[0].n * 2;
    void *px, *p1, *p2 = NULL;
    if ((st = mg_cpu_kernel_buffer(l, 6, (uint64_t)*m * w[0].k * 2, 16, name, &px)) ||
        (st = mg_cpu_kernel_buffer(l, 7, out_bytes, 2, name, &p1)) ||
        (*epilogue == MG_MLX_GATE_UP_BOTH &&
         (st = mg_cpu_kernel_buffer(l, 8, out_bytes, 2, name, &p2))))
        return st;
    if (*epilogue == MG_MLX_GATE_UP_SILU_MUL && !(p2 = malloc(out_bytes)))
        return MG_ERROR(MG_ERR_OUT_OF_MEMORY, "cpu kernel %s: no host memory", name);
    *x = px;
    *y1 = p1;
    *y2 = p2;
    return MG_OK;
}

mg_status mg_mlx_cpu_gate_up_finish(mg_status st, uint32_t epilogue, uint32_t m, uint32_t n,
                                    uint16_t *y1, uint16_t *y2) {
    if (epilogue != MG_MLX_GATE_UP_SILU_MUL)
        return st;
    for (size_t i = 0; !st && i < (size_t)m * n; i++)
        y1[i] = mg_silu_mul_reference_one(y1[i], y2[i]);
    free(y2);
    return st;
}

static mg_status kernel_dequant(const mg_launch *l) {
    layer w;
    uint16_t *out;
    mg_status st = mg_mlx_cpu_dequant_args(l, "metrale:" MG_MLX_KERNEL_DEQUANT, &w, &out);
    if (!st)
        dequant(&w, out);
    return st;
}

static mg_status kernel_gemv(const mg_launch *l) {
    layer w;
    uint32_t m;
    const uint16_t *x, *u, *resid;
    uint16_t *y;
    mg_status st =
        mg_mlx_cpu_gemv_args(l, "metrale:" MG_MLX_KERNEL_GEMV, &w, &m, &x, &u, &resid, &y);
    return st ? st : gemv(&w, m, x, u, resid, y);
}

static mg_status kernel_gemv_gate_up(const mg_launch *l) {
    layer w[2];
    uint32_t m;
    const uint16_t *x;
    uint16_t *y1, *y2;
    uint32_t epilogue;
    mg_status st = mg_mlx_cpu_gate_up_args(l, "metrale:" MG_MLX_KERNEL_GEMV_GATE_UP, w, &m, &x, &y1,
                                           &y2, &epilogue);
    if (st)
        return st;
    if (!(st = gemv(&w[0], m, x, NULL, NULL, y1)))
        st = gemv(&w[1], m, x, NULL, NULL, y2);
    return mg_mlx_cpu_gate_up_finish(st, epilogue, m, w[0].n, y1, y2);
}

/* y[t, r] = bf16(y[t, r] + bias[r]) in FP32 (metrale/mlx.h). */
static mg_status kernel_add_bias(const mg_launch *l) {
    static const char name[] = "metrale:" MG_MLX_KERNEL_ADD_BIAS;
    static const mg_arg_kind kinds[] = {MG_ARG_BUFFER, MG_ARG_BUFFER, MG_ARG_U32, MG_ARG_U32,
                                        MG_ARG_U32};
    mg_status st = mg_cpu_kernel_check_args(l, name, kinds, 5);
    if (st)
        return st;
    uint32_t m = mg_launch_get_u32(l, 2), n = mg_launch_get_u32(l, 3);
    uint32_t type = mg_launch_get_u32(l, 4);
    if (type > MG_MLX_BIAS_F32)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "cpu kernel %s: bias_type=%u", name, type);
    void *y, *bias;
    if ((st = mg_cpu_kernel_buffer(l, 0, (uint64_t)m * n * 2, 2, name, &y)) ||
        (st = mg_cpu_kernel_buffer(l, 1, (uint64_t)n * (type == MG_MLX_BIAS_F32 ? 4 : 2),
                                   type == MG_MLX_BIAS_F32 ? 4 : 2, name, &bias)))
        return st;
    uint16_t *out = y;
    for (uint32_t t = 0; t < m; t++)
        for (uint32_t r = 0; r < n; r++) {
            float b =
                type == MG_MLX_BIAS_F32
                    ? ((const float *)bias)[r]
                    : scale_to_f32(
                          bias, type == MG_MLX_BIAS_F16 ? MG_MLX_SCALE_F16 : MG_MLX_SCALE_BF16, r);
            size_t i = (size_t)t * n + r;
            out[i] = mg_f32_to_bf16(mg_bf16_to_f32(out[i]) + b);
        }
    return MG_OK;
}

static void register_kernels(void) {
    /* Failure is out of host memory at start-up; the lookups then report NOT_FOUND. */
    mg_cpu_kernel_register("metrale", MG_MLX_KERNEL_DEQUANT, kernel_dequant);
    mg_cpu_kernel_register("metrale", MG_MLX_KERNEL_GEMV, kernel_gemv);
    mg_cpu_kernel_register("metrale", MG_MLX_KERNEL_GEMV_GATE_UP, kernel_gemv_gate_up);
    mg_cpu_kernel_register("metrale", MG_MLX_KERNEL_ADD_BIAS, kernel_add_bias);
}

void mg_mlx_cpu_kernels_register(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, register_kernels);
}
