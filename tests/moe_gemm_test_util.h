/*
 * moe_gemm_test_util.h - random grouped MoE GEMM problems (metrale/ops_moe_gemm.h) for the CPU
 * and CUDA tests: host data, upload to a backend, one call, the result read back.
 */
#ifndef METRALE_MOE_GEMM_TEST_UTIL_H
#define METRALE_MOE_GEMM_TEST_UTIL_H

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "metrale/dtype.h"
#include "metrale/gpu.h"
#include "metrale/ops_moe_gemm.h"
#include "test_util.h"

typedef struct moe_case {
    mg_moe_gemm_kind kind;
    bool gate_up, with_ids;
    uint32_t experts, rows, act_rows, n, k, act_pitch, ldc;
    uint32_t tail; /* rows past expert_offsets[experts] (not computed) */
    int skew;      /* 0: random sizes; 1: one expert takes most rows; 2: every other empty */
} moe_case;

typedef struct moe_data {
    moe_case c;
    uint32_t n_w, pitch, ldc;
    uint16_t *act;
    int32_t *ids, *offsets;
    void *weight;
    float *scale;
    size_t act_bytes, weight_bytes, scale_bytes, out_bytes;
} moe_data;

static inline float moe_test_uniform(float lo, float hi) {
    return lo + (hi - lo) * (float)(test_rand() >> 40) / (float)(1ull << 24);
}

/* Routing for `rows - tail` rows over the experts as c.skew says. */
static inline void moe_test_routing(const moe_case *c, int32_t *offsets) {
    uint32_t routed = c->rows - c->tail, e_count = c->experts;
    uint32_t *counts = calloc(e_count, sizeof *counts);
    uint32_t left = routed;
    if (c->skew == 1) {
        uint32_t big = (uint32_t)test_rand_range(0, e_count - 1);
        counts[big] = routed - routed / 8;
        left = routed / 8;
    }
    while (left) {
        uint32_t e = (uint32_t)test_rand_range(0, e_count - 1);
        if (c->skew == 2 && e % 2)
            e--;
        counts[e]++;
        left--;
    }
    offsets[0] = 0;
    for (uint32_t e = 0; e < e_count; e++)
        offsets[e + 1] = offsets[e] + (int32_t)counts[e];
    free(counts);
}

/* Fresh random inputs for `c`. FP8 weight codes avoid NaN (0x7f, 0xff). */
static inline void moe_test_make(const moe_case *c, moe_data *d) {
    memset(d, 0, sizeof *d);
    d->c = *c;
    d->n_w = c->gate_up ? 2 * c->n : c->n;
    d->pitch = c->act_pitch ? c->act_pitch : c->k;
    d->ldc = c->ldc ? c->ldc : c->n;
    bool fp8 = c->kind != MG_MOE_GEMM_BF16;
    d->act_bytes = ((size_t)(c->act_rows - 1) * d->pitch + c->k) * 2;
    d->act = malloc(d->act_bytes);
    for (size_t i = 0; i < d->act_bytes / 2; i++)
        d->act[i] = mg_f32_to_bf16(moe_test_uniform(-2.0f, 2.0f));
    d->offsets = malloc(((size_t)c->experts + 1) * 4);
    moe_test_routing(c, d->offsets);
    if (c->with_ids) {
        d->ids = malloc((size_t)c->rows * 4);
        for (uint32_t r = 0; r < c->rows; r++)
            d->ids[r] = (int32_t)test_rand_range(0, c->act_rows - 1);
    }
    size_t elems = (size_t)c->experts * d->n_w * c->k;
    d->weight_bytes = elems * (fp8 ? 1 : 2);
    d->weight = malloc(d->weight_bytes);
    for (size_t i = 0; i < elems; i++) {
        if (fp8) {
            uint8_t code = (uint8_t)test_rand();
            ((uint8_t *)d->weight)[i] = (code & 0x7f) == 0x7f ? (uint8_t)(code ^ 1) : code;
        } else {
            ((uint16_t *)d->weight)[i] = mg_f32_to_bf16(moe_test_uniform(-1.0f, 1.0f));
        }
    }
    size_t scales = 0;
    if (c->kind == MG_MOE_GEMM_FP8_ROWWISE)
        scales = (size_t)c->experts * d->n_w;
    else if (c->kind == MG_MOE_GEMM_FP8_BLOCKSCALED)
        scales = (size_t)c->experts * ((d->n_w + 127) / 128) * ((c->k + 127) / 128);
    d->scale_bytes = scales * 4;
    d->scale = scales ? malloc(d->scale_bytes) : NULL;
    for (size_t i = 0; i < scales; i++)
        d->scale[i] = moe_test_uniform(0.002f, 0.02f);
    d->out_bytes = ((size_t)(c->rows - 1) * d->ldc + c->n) * 2;
}

static inline void moe_test_free(moe_data *d) {
    free(d->act);
    free(d->ids);
    free(d->offsets);
    free(d->weight);
    free(d->scale);
}

static inline mg_moe_gemm_desc moe_test_desc(const moe_data *d) {
    return (mg_moe_gemm_desc){.kind = d->c.kind,
                              .experts = d->c.experts,
                              .rows = d->c.rows,
                              .act_rows = d->c.act_rows,
                              .n = d->c.n,
                              .k = d->c.k,
                              .act_pitch = d->c.act_pitch,
                              .ldc = d->c.ldc,
                              .gate_up = d->c.gate_up};
}

/* The problem's buffers on one backend. */
typedef struct moe_device {
    mg_devptr act, ids, offsets, weight, scale, out, workspace;
    size_t workspace_bytes;
} moe_device;

static inline mg_status moe_test_upload(mg_backend *b, const moe_data *d, moe_device *m) {
    memset(m, 0, sizeof *m);
    mg_moe_gemm_desc desc = moe_test_desc(d);
    mg_status st;
    if ((st = mg_moe_gemm_workspace_bytes(b, &desc, &m->workspace_bytes)) ||
        (st = mg_alloc(b, d->act_bytes, &m->act)) ||
        (st = mg_copy_h2d(b, m->act, d->act, d->act_bytes)) ||
        (st = mg_alloc(b, ((size_t)d->c.experts + 1) * 4, &m->offsets)) ||
        (st = mg_copy_h2d(b, m->offsets, d->offsets, ((size_t)d->c.experts + 1) * 4)) ||
        (st = mg_alloc(b, d->weight_bytes, &m->weight)) ||
        (st = mg_copy_h2d(b, m->weight, d->weight, d->weight_bytes)) ||
        (st = mg_alloc(b, d->out_bytes, &m->out)))
        return st;
    if (d->ids && ((st = mg_alloc(b, (size_t)d->c.rows * 4, &m->ids)) ||
                   (st = mg_copy_h2d(b, m->ids, d->ids, (size_t)d->c.rows * 4))))
        return st;
    if (d->scale && ((st = mg_alloc(b, d->scale_bytes, &m->scale)) ||
                     (st = mg_copy_h2d(b, m->scale, d->scale, d->scale_bytes))))
        return st;
    if (m->workspace_bytes && (st = mg_alloc(b, m->workspace_bytes, &m->workspace)))
        return st;
    return MG_OK;
}

static inline void moe_test_release(mg_backend *b, moe_device *m) {
    const mg_devptr all[] = {m->act, m->ids, m->offsets, m->weight, m->scale, m->out, m->workspace};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (all[i])
            mg_free(b, all[i]);
}

static inline mg_moe_gemm_tensors moe_test_tensors(const moe_device *m) {
    return (mg_moe_gemm_tensors){.act = m->act,
                                 .sorted_token_ids = m->ids,
                                 .expert_offsets = m->offsets,
                                 .weight = m->weight,
                                 .weight_scale = m->scale,
                                 .out = m->out,
                                 .workspace = m->workspace,
                                 .workspace_bytes = m->workspace_bytes};
}

/* out poisoned with 0xFF (BF16 NaN), then one call on `s`, synchronized, read back into
 * `out` (d->out_bytes). */
static inline mg_status moe_test_run(mg_backend *b, mg_stream *s, const moe_data *d,
                                     const moe_device *m, uint16_t *out) {
    memset(out, 0xff, d->out_bytes);
    mg_moe_gemm_desc desc = moe_test_desc(d);
    mg_moe_gemm_tensors t = moe_test_tensors(m);
    mg_status st;
    if ((st = mg_copy_h2d(b, m->out, out, d->out_bytes)) || (st = mg_moe_gemm(b, s, &desc, &t)) ||
        (st = mg_stream_synchronize(s ? s : mg_stream_default(b))))
        return st;
    return mg_copy_d2h(b, out, m->out, d->out_bytes);
}

/* Whether output row r is computed (below expert_offsets[experts]). */
static inline bool moe_test_row_routed(const moe_data *d, uint32_t r) {
    return r < (uint32_t)d->offsets[d->c.experts];
}

#endif
