/* mlx_reference.c - the CPU reference of the MLX ops (mlx_reference.h, metrale/mlx.h), run by
 * the CPU backend as the kernels mlx_dequant, mlx_gemv, mlx_gemv_gate_up and mlx_add_bias. The GEMVs
 * accumulate in double: they define the result the CUDA kernels' FP32 sums approximate. */
#include "mlx_reference.h"

#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <string.h>

#include "cpu_kernels.h"
#include "error.h"
#include "metrale/dtype.h"
#include "metrale/launch.h"

/* ------------------------------------------------------------------ FP16 */

static float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    float v;
    if (exp == 0)
        v = ldexpf((float)man, -24); /* subnormal or zero: exact */
    else if (exp == 31)
        v = man ? NAN : INFINITY;
    else
        v = ldexpf((float)(man | 0x400u), (int)exp - 25);
    uint32_t bits;
    memcpy(&bits, &v, 4);
    bits |= sign;
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

typedef struct layer {
    const uint32_t *weight;
    const uint16_t *scales, *biases;
    uint32_t n, k, bits, group_size, scale_type;
} layer;

static uint32_t code(const layer *w, uint32_t row, uint32_t j) {
    uint32_t per_word = 32 / w->bits;
    uint32_t word = w->weight[(size_t)row * (w->k / per_word) + j / per_word];
    return (word >> ((j % per_word) * w->bits)) & ((1u << w->bits) - 1);
}

static size_t group_index(const layer *w, uint32_t row, uint32_t j) {
    return (size_t)row * (w->k / w->group_size) + j / w->group_size;
}

static void dequant(const layer *w, uint16_t *out) {
    for (uint32_t r = 0; r < w->n; r++)
        for (uint32_t j = 0; j < w->k; j++) {
            size_t g = group_index(w, r, j);
            float scale = scale_to_f32(w->scales, w->scale_type, g);
            float bias = scale_to_f32(w->biases, w->scale_type, g);
            float t = round_to_scale_type(scale * (float)code(w, r, j), w->scale_type);
            out[(size_t)r * w->k + j] = mg_f32_to_bf16(round_to_scale_type(t + bias, w->scale_type));
        }
}

static float silu_gate_value(uint16_t g, uint16_t u) {
    float gf = mg_bf16_to_f32(g);
    return mg_bf16_to_f32(mg_f32_to_bf16(gf / (1.0f + expf(-gf)) * mg_bf16_to_f32(u)));
}

/* y[m, n] = act · Wᵀ (+ resid): act is x, or silu(x) * u rounded to BF16 when `u` is set. */
static void gemv(const layer *w, uint32_t m, const uint16_t *x, const uint16_t *u,
                 const uint16_t *resid, uint16_t *y) {
    for (uint32_t t = 0; t < m; t++)
        for (uint32_t r = 0; r < w->n; r++) {
            double sum = 0;
            for (uint32_t j0 = 0; j0 < w->k; j0 += w->group_size) {
                double qx = 0, xs = 0;
                for (uint32_t j = j0; j < j0 + w->group_size; j++) {
                    size_t i = (size_t)t * w->k + j;
                    double a = u ? silu_gate_value(x[i], u[i]) : mg_bf16_to_f32(x[i]);
                    qx += code(w, r, j) * a;
                    xs += a;
                }
                size_t g = group_index(w, r, j0);
                sum += scale_to_f32(w->scales, w->scale_type, g) * qx +
                       scale_to_f32(w->biases, w->scale_type, g) * xs;
            }
            size_t o = (size_t)t * w->n + r;
            if (resid)
                sum += mg_bf16_to_f32(resid[o]);
            y[o] = mg_f32_to_bf16((float)sum);
        }
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

static mg_status kernel_dequant(const mg_launch *l) {
    static const char name[] = "metrale:" MG_MLX_KERNEL_DEQUANT;
    static const mg_arg_kind kinds[] = {MG_ARG_BUFFER, MG_ARG_BUFFER, MG_ARG_BUFFER,
                                        MG_ARG_BUFFER, MG_ARG_U32,    MG_ARG_U32,
                                        MG_ARG_U32,    MG_ARG_U32,    MG_ARG_U32};
    mg_status st = mg_cpu_kernel_check_args(l, name, kinds, 9);
    layer w;
    void *out;
    if (st || (st = resolve_layer(l, 0, 4, name, &w)) ||
        (st = mg_cpu_kernel_buffer(l, 3, (uint64_t)w.n * w.k * 2, 16, name, &out)))
        return st;
    dequant(&w, out);
    return MG_OK;
}

static mg_status kernel_gemv(const mg_launch *l) {
    static const char name[] = "metrale:" MG_MLX_KERNEL_GEMV;
    static const mg_arg_kind kinds[] = {
        MG_ARG_BUFFER, MG_ARG_BUFFER, MG_ARG_BUFFER, MG_ARG_BUFFER, MG_ARG_BUFFER,
        MG_ARG_BUFFER, MG_ARG_BUFFER, MG_ARG_U32,    MG_ARG_U32,    MG_ARG_U32,
        MG_ARG_U32,    MG_ARG_U32,    MG_ARG_U32,    MG_ARG_U32};
    mg_status st = mg_cpu_kernel_check_args(l, name, kinds, 14);
    if (st)
        return st;
    uint32_t m = mg_launch_get_u32(l, 7), mode = mg_launch_get_u32(l, 13);
    layer w;
    if ((st = resolve_layer(l, 0, 8, name, &w)))
        return st;
    if (m == 0 || m > MG_MLX_GEMV_MAX_M || mode > MG_MLX_GEMV_SILU_GATE_RESID)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "cpu kernel %s: m=%u mode=%u", name, m, mode);
    uint64_t act_bytes = (uint64_t)m * w.k * 2, out_bytes = (uint64_t)m * w.n * 2;
    void *x, *u = NULL, *resid = NULL, *y;
    if ((st = mg_cpu_kernel_buffer(l, 3, act_bytes, 16, name, &x)) ||
        (mode != MG_MLX_GEMV_PLAIN &&
         (st = mg_cpu_kernel_buffer(l, 4, act_bytes, 16, name, &u))) ||
        (mode == MG_MLX_GEMV_SILU_GATE_RESID &&
         (st = mg_cpu_kernel_buffer(l, 5, out_bytes, 2, name, &resid))) ||
        (st = mg_cpu_kernel_buffer(l, 6, out_bytes, 2, name, &y)))
        return st;
    gemv(&w, m, x, u, resid, y);
    return MG_OK;
}

static mg_status kernel_gemv_gate_up(const mg_launch *l) {
    static const char name[] = "metrale:" MG_MLX_KERNEL_GEMV_GATE_UP;
    static const mg_arg_kind kinds[] = {
        MG_ARG_BUFFER, MG_ARG_BUFFER, MG_ARG_BUFFER, MG_ARG_BUFFER, MG_ARG_BUFFER,
        MG_ARG_BUFFER, MG_ARG_BUFFER, MG_ARG_BUFFER, MG_ARG_BUFFER, MG_ARG_U32,
        MG_ARG_U32,    MG_ARG_U32,    MG_ARG_U32,    MG_ARG_U32,    MG_ARG_U32};
    mg_status st = mg_cpu_kernel_check_args(l, name, kinds, 15);
    if (st)
        return st;
    uint32_t m = mg_launch_get_u32(l, 9);
    layer gate, up;
    if ((st = resolve_layer(l, 0, 10, name, &gate)) || (st = resolve_layer(l, 3, 10, name, &up)))
        return st;
    if (m == 0 || m > MG_MLX_GEMV_MAX_M)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "cpu kernel %s: m=%u", name, m);
    void *x, *y1, *y2;
    if ((st = mg_cpu_kernel_buffer(l, 6, (uint64_t)m * gate.k * 2, 16, name, &x)) ||
        (st = mg_cpu_kernel_buffer(l, 7, (uint64_t)m * gate.n * 2, 2, name, &y1)) ||
        (st = mg_cpu_kernel_buffer(l, 8, (uint64_t)m * gate.n * 2, 2, name, &y2)))
        return st;
    gemv(&gate, m, x, NULL, NULL, y1);
    gemv(&up, m, x, NULL, NULL, y2);
    return MG_OK;
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
            float b = type == MG_MLX_BIAS_F32 ? ((const float *)bias)[r]
                      : scale_to_f32(bias, type == MG_MLX_BIAS_F16 ? MG_MLX_SCALE_F16
                                                                    : MG_MLX_SCALE_BF16, r);
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
