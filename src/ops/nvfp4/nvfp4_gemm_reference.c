/* nvfp4_gemm_reference.c - the CPU kernels of the NVFP4 GEMM op (nvfp4_gemm_reference.h): the
 * re-layout, bit for bit as the CUDA kernel writes it, and the reference GEMMs. */
#include "nvfp4_gemm_reference.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_kernels.h"
#include "elementwise_host.h"
#include "error.h"
#include "metrale/dtype.h"
#include "metrale/launch.h"
#include "moe_routing_host.h"
#include "nvfp4_hopper_layout.h"

void mg_nvfp4_gemm_kernel_name(char *buf, unsigned bytes, unsigned tile_tokens, unsigned k_warps,
                               int gate_up, mg_nvfp4_kernel_fusion fusion) {
    snprintf(buf, bytes, "nvfp4_gemm_%s%st%u_k%u", gate_up ? "gate_up_" : "",
             fusion == MG_NVFP4_KERNEL_NORM  ? "norm_"
             : fusion == MG_NVFP4_KERNEL_ADD ? "add_"
                                             : "",
             tile_tokens, k_warps);
}

void mg_nvfp4_gemm_tile_kernel_name(char *buf, unsigned bytes, unsigned tile_tokens,
                                    unsigned cta_rows, unsigned k_groups, int gate_up) {
    snprintf(buf, bytes, "nvfp4_gemm_%st%u_r%u_k%u", gate_up ? "gate_up_" : "", tile_tokens,
             cta_rows, k_groups);
}

int mg_nvfp4_tile_variant_exists(unsigned tile_tokens, unsigned row_warps, unsigned k_groups) {
    return (tile_tokens == 32 || tile_tokens == 64) &&
           (row_warps == 1 || row_warps == 2 || row_warps == 4) &&
           (k_groups == 1 || k_groups == 2 || (k_groups == 4 && tile_tokens == 32)) &&
           row_warps * k_groups <= 8;
}

/* ------------------------------------------------------------------ the re-layout */

static mg_status kernel_prepare(const mg_launch *l) {
    static const char name[] = "metrale:" MG_NVFP4_KERNEL_PREPARE;
    static const mg_arg_kind kinds[] = {MG_ARG_BUFFER, MG_ARG_BUFFER, MG_ARG_BUFFER, MG_ARG_BUFFER,
                                        MG_ARG_U32,    MG_ARG_U32,    MG_ARG_U32};
    mg_status st = mg_cpu_kernel_check_args(l, name, kinds, 7);
    if (st)
        return st;
    uint32_t n = mg_launch_get_u32(l, 4), k = mg_launch_get_u32(l, 5),
             experts = mg_launch_get_u32(l, 6);
    uint32_t row_blocks = mg_nvfp4_row_blocks(n), supers = mg_nvfp4_supers(k), kb = k / 16;
    uint64_t rows = (uint64_t)experts * n;
    uint64_t value_bytes = (uint64_t)row_blocks * supers * MG_NVFP4_SUPER_BYTES;
    uint64_t scale_bytes = (uint64_t)row_blocks * supers * MG_NVFP4_SUPER_SCALE_BYTES;
    uint8_t *codes, *e4m3, *values, *scales;
    if ((st = mg_cpu_kernel_buffer(l, 0, rows * (k / 2), 1, name, (void **)&codes)) ||
        (st = mg_cpu_kernel_buffer(l, 1, rows * kb, 1, name, (void **)&e4m3)) ||
        (st = mg_cpu_kernel_buffer(l, 2, value_bytes * experts, 16, name, (void **)&values)) ||
        (st = mg_cpu_kernel_buffer(l, 3, scale_bytes * experts, 16, name, (void **)&scales)))
        return st;
    /* Padding (rows past n, K past k) is zero codes and zero scale bytes. */
    memset(values, 0, value_bytes * experts);
    memset(scales, 0, scale_bytes * experts);
    for (uint32_t e = 0; e < experts; e++) {
        uint8_t *ev = values + e * value_bytes, *es = scales + e * scale_bytes;
        for (uint32_t r = 0; r < n; r++) {
            uint64_t grow = (uint64_t)e * n + r;
            for (uint32_t q = 0; q < kb; q++) {
                uint32_t scale = e4m3[grow * kb + q];
                es[mg_nvfp4_scale_offset(supers, r, q)] = (uint8_t)mg_nvfp4_ue5m3_from_e4m3(scale);
                if (mg_nvfp4_scale_clears_block(scale))
                    continue;
                for (uint32_t i = 0; i < 16; i++) {
                    uint32_t kk = q * 16 + i, shift;
                    uint32_t code = (codes[grow * (k / 2) + kk / 2] >> (4 * (kk % 2))) & 15u;
                    /* the offset first: `shift` is its output (the operands of one
                     * expression are unsequenced) */
                    size_t at = mg_nvfp4_value_offset(supers, r, kk, &shift);
                    ev[at] |= (uint8_t)(code << shift);
                }
            }
        }
    }
    return MG_OK;
}

/* ------------------------------------------------------------------ the GEMMs */

static double e2m1_value(uint32_t code) {
    static const double magnitude[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
    return (code & 8u) ? -magnitude[code & 7u] : magnitude[code & 7u];
}

static double ue5m3_value(uint32_t u) {
    return ldexp(1.0 + (u & 7u) / 8.0, (int)(u >> 3) - 15);
}

/* One prepared weight matrix of n x k decoded to FP64 rows [n, k]. */
static void decode_weight(const uint8_t *values, const uint8_t *scales, uint32_t n, uint32_t k,
                          double *out) {
    uint32_t supers = mg_nvfp4_supers(k);
    for (uint32_t r = 0; r < n; r++)
        for (uint32_t q = 0; q < k / 16; q++) {
            double scale = ue5m3_value(scales[mg_nvfp4_scale_offset(supers, r, q)]);
            for (uint32_t i = 0; i < 16; i++) {
                uint32_t kk = q * 16 + i, shift;
                size_t at = mg_nvfp4_value_offset(supers, r, kk, &shift); /* sets shift */
                uint32_t code = (values[at] >> shift) & 15u;
                out[(size_t)r * k + kk] = e2m1_value(code) * scale;
            }
        }
}

typedef mg_nvfp4_cpu_gemm_call gemm_call;

static double dot_row(const uint16_t *x, const double *w, uint32_t k) {
    double sum = 0;
    for (uint32_t i = 0; i < k; i++)
        sum += (double)mg_bf16_to_f32(x[i]) * w[i];
    return sum;
}

static mg_status run_gemm(const gemm_call *c, const char *name) {
    double *w = malloc(sizeof(double) * c->n * c->k);
    double *up = c->up_values ? malloc(sizeof(double) * c->n * c->k) : NULL;
    if (!w || (c->up_values && !up)) {
        free(w);
        free(up);
        return MG_ERROR(MG_ERR_OUT_OF_MEMORY, "%s: no host memory for the decoded weights", name);
    }
    uint32_t groups = c->offsets ? c->experts : 1;
    for (uint32_t e = 0; e < groups; e++) {
        uint32_t begin = c->offsets ? (uint32_t)c->offsets[e] : 0;
        uint32_t end = c->offsets ? (uint32_t)c->offsets[e + 1] : c->rows;
        if (begin == end)
            continue;
        decode_weight(c->values + e * c->expert_value_bytes, c->scales + e * c->expert_scale_bytes,
                      c->n, c->k, w);
        if (up)
            decode_weight(c->up_values + e * c->expert_value_bytes,
                          c->up_scales + e * c->expert_scale_bytes, c->n, c->k, up);
        for (uint32_t r = begin; r < end; r++) {
            uint32_t src = c->token_ids ? (uint32_t)c->token_ids[r] : r;
            const uint16_t *x = c->act + (size_t)src * c->act_pitch;
            for (uint32_t j = 0; j < c->n; j++) {
                double v = dot_row(x, w + (size_t)j * c->k, c->k) * c->global[e];
                if (up) {
                    double u = dot_row(x, up + (size_t)j * c->k, c->k) * c->up_global[e];
                    v = v / (1.0 + exp(-v)) * u;
                }
                c->out[(size_t)r * c->ldc + j] = mg_f32_to_bf16((float)v);
            }
        }
    }
    free(w);
    free(up);
    return MG_OK;
}

mg_status mg_nvfp4_cpu_gemm_args(const mg_launch *l, const char *name, gemm_call *out) {
    static const mg_arg_kind kinds[MG_NVFP4_GEMM_FUSED_ARGS] = {
        MG_ARG_BUFFER, MG_ARG_U32,    MG_ARG_U32,    MG_ARG_BUFFER, MG_ARG_BUFFER, MG_ARG_U32,
        MG_ARG_U32,    MG_ARG_BUFFER, MG_ARG_BUFFER, MG_ARG_U64,    MG_ARG_U64,    MG_ARG_BUFFER,
        MG_ARG_BUFFER, MG_ARG_BUFFER, MG_ARG_BUFFER, MG_ARG_BUFFER, MG_ARG_U32,    MG_ARG_U32,
        MG_ARG_U32,    MG_ARG_BUFFER, MG_ARG_BUFFER, MG_ARG_F32};
    const bool fused = l->arg_count == MG_NVFP4_GEMM_FUSED_ARGS;
    mg_status st = mg_cpu_kernel_check_args(l, name, kinds,
                                            fused ? MG_NVFP4_GEMM_FUSED_ARGS : MG_NVFP4_GEMM_ARGS);
    if (st)
        return st;
    gemm_call c = {.act_pitch = mg_launch_get_u32(l, 1),
                   .act_rows = mg_launch_get_u32(l, 2),
                   .experts = mg_launch_get_u32(l, 5),
                   .rows = mg_launch_get_u32(l, 6),
                   .expert_value_bytes = mg_launch_get_u64(l, 9),
                   .expert_scale_bytes = mg_launch_get_u64(l, 10),
                   .ldc = mg_launch_get_u32(l, 16),
                   .n = mg_launch_get_u32(l, 17),
                   .k = mg_launch_get_u32(l, 18)};
    bool dense = mg_launch_get_ptr(l, 4) == 0, gate_up = mg_launch_get_ptr(l, 12) != 0;
    uint32_t groups = dense ? 1 : c.experts;
    uint64_t act_bytes = c.act_rows ? ((uint64_t)(c.act_rows - 1) * c.act_pitch + c.k) * 2 : 0;
    uint64_t out_bytes = ((uint64_t)(c.rows - 1) * c.ldc + c.n) * 2;
    void *p[MG_NVFP4_GEMM_FUSED_ARGS] = {0};
    if ((st = mg_cpu_kernel_buffer(l, 0, act_bytes, 16, name, &p[0])) ||
        (mg_launch_get_ptr(l, 3) &&
         (st = mg_cpu_kernel_buffer(l, 3, (uint64_t)c.rows * 4, 4, name, &p[3]))) ||
        (!dense &&
         (st = mg_cpu_kernel_buffer(l, 4, ((uint64_t)c.experts + 1) * 4, 4, name, &p[4]))) ||
        (st = mg_cpu_kernel_buffer(l, 7, c.expert_value_bytes * groups, 16, name, &p[7])) ||
        (st = mg_cpu_kernel_buffer(l, 8, c.expert_scale_bytes * groups, 16, name, &p[8])) ||
        (st = mg_cpu_kernel_buffer(l, 11, (uint64_t)groups * 4, 4, name, &p[11])) ||
        (gate_up &&
         ((st = mg_cpu_kernel_buffer(l, 12, c.expert_value_bytes * groups, 16, name, &p[12])) ||
          (st = mg_cpu_kernel_buffer(l, 13, c.expert_scale_bytes * groups, 16, name, &p[13])) ||
          (st = mg_cpu_kernel_buffer(l, 14, (uint64_t)groups * 4, 4, name, &p[14])))) ||
        (st = mg_cpu_kernel_buffer(l, 15, out_bytes, 2, name, &p[15])) ||
        (fused && mg_launch_get_ptr(l, 19) &&
         (st = mg_cpu_kernel_buffer(l, 19, (uint64_t)c.k * 2, 16, name, &p[19]))) ||
        (fused && mg_launch_get_ptr(l, 20) &&
         (st = mg_cpu_kernel_buffer(l, 20, out_bytes, 2, name, &p[20]))))
        return st;
    if (fused && (!dense || gate_up ? p[20] != NULL : !p[19] && !p[20]))
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "cpu kernel %s: a fused launch is dense, with a norm weight or a residual "
                        "(gate_up: no residual)",
                        name);
    c.norm_weight = p[19];
    c.residual = p[20];
    c.eps = fused ? mg_launch_get_f32(l, 21) : 0.0f;
    c.act = p[0];
    c.token_ids = p[3];
    c.offsets = p[4];
    c.values = p[7];
    c.scales = p[8];
    c.global = p[11];
    c.up_values = p[12];
    c.up_scales = p[13];
    c.up_global = p[14];
    c.out = p[15];
    if ((st = mg_moe_routing_check_host(name, c.offsets, c.experts, c.rows, true, c.token_ids,
                                        c.act_rows)))
        return st;
    *out = c;
    return MG_OK;
}

mg_status mg_nvfp4_cpu_gemm_run(const gemm_call *c, const char *name,
                                mg_status (*gemm)(const gemm_call *, const char *)) {
    if (!c->norm_weight && !c->residual)
        return gemm(c, name);
    /* dense (mg_nvfp4_cpu_gemm_args): act_rows == rows, no token ids */
    const size_t act_n = (size_t)c->rows * c->k, out_n = (size_t)c->rows * c->n;
    uint16_t *raw = c->norm_weight ? malloc(act_n * 2) : NULL;
    uint16_t *normed = c->norm_weight ? malloc(act_n * 2) : NULL;
    uint16_t *product = c->residual ? malloc(out_n * 2) : NULL;
    mg_status st = MG_OK;
    if ((c->norm_weight && (!raw || !normed)) || (c->residual && !product))
        st = MG_ERROR(MG_ERR_OUT_OF_MEMORY, "%s: no host memory for the fusion", name);
    gemm_call inner = *c;
    if (!st && c->norm_weight) {
        for (uint32_t r = 0; r < c->rows; r++)
            memcpy(raw + (size_t)r * c->k, c->act + (size_t)r * c->act_pitch, (size_t)c->k * 2);
        mg_rmsnorm_bf16_host(c->rows, c->k, c->eps, raw, NULL, c->norm_weight, normed);
        inner.act = normed;
        inner.act_pitch = c->k;
    }
    if (!st && c->residual) {
        inner.out = product;
        inner.ldc = c->n;
    }
    if (!st)
        st = gemm(&inner, name);
    for (uint32_t r = 0; !st && c->residual && r < c->rows; r++)
        for (uint32_t j = 0; j < c->n; j++) {
            const size_t at = (size_t)r * c->ldc + j;
            c->out[at] = mg_f32_to_bf16(mg_bf16_to_f32(product[(size_t)r * c->n + j]) +
                                        mg_bf16_to_f32(c->residual[at]));
        }
    free(raw);
    free(normed);
    free(product);
    return st;
}

static mg_status kernel_gemm(const mg_launch *l) {
    static const char name[] = "metrale:nvfp4_gemm";
    gemm_call c;
    mg_status st = mg_nvfp4_cpu_gemm_args(l, name, &c);
    return st ? st : mg_nvfp4_cpu_gemm_run(&c, name, run_gemm);
}

static void register_kernels(void) {
    mg_cpu_kernel_register("metrale", MG_NVFP4_KERNEL_PREPARE, kernel_prepare);
    static const unsigned tiles[] = {8, 16}, warps[] = {1, 2, 4, 8};
    for (int fusion = MG_NVFP4_KERNEL_PLAIN; fusion <= MG_NVFP4_KERNEL_NORM; fusion++)
        for (int gate_up = 0; gate_up < 2; gate_up++)
            for (unsigned t = 0; t < 2; t++)
                for (unsigned w = 0; w < 4; w++) {
                    /* gate_up is fused with the norm only */
                    if (gate_up && fusion == MG_NVFP4_KERNEL_ADD)
                        continue;
                    char name[48];
                    mg_nvfp4_gemm_kernel_name(name, sizeof name, tiles[t], warps[w], gate_up,
                                              (mg_nvfp4_kernel_fusion)fusion);
                    mg_cpu_kernel_register("metrale", name, kernel_gemm);
                }
    for (int gate_up = 0; gate_up < 2; gate_up++)
        for (unsigned tile = 32; tile <= 64; tile *= 2)
            for (unsigned wr = 1; wr <= 4; wr *= 2)
                for (unsigned kw = 1; kw <= 4; kw *= 2) {
                    if (!mg_nvfp4_tile_variant_exists(tile, wr, kw))
                        continue;
                    char name[48];
                    mg_nvfp4_gemm_tile_kernel_name(name, sizeof name, tile,
                                                   wr * (gate_up ? 16 : 32), kw, gate_up);
                    mg_cpu_kernel_register("metrale", name, kernel_gemm);
                }
}

void mg_nvfp4_cpu_kernels_register(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, register_kernels);
}
