/* test_metal_kv_append.c - mg_kv_append on the Metal backend (through the test double) against
 * the CPU backend, on the same random batch: three requests of awkward lengths, RoPE on K and
 * Q, explicit positions or none, BF16 and FP8 pools. Pools and Q are poisoned first on both
 * backends, and every byte must agree afterwards. The paged-attention checks cannot cover the
 * append on Metal (attention has no Metal provider), so this is its op check here. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "metrale/gpu.h"
#include "metrale/ops_kv_cache.h"

static int failures;
#define OK(call)                                                                                   \
    do {                                                                                           \
        mg_status st_ = (call);                                                                    \
        if (st_ != MG_OK) {                                                                        \
            printf("FAIL %s:%d: %s: %s: %s\n", __FILE__, __LINE__, #call, mg_status_name(st_),     \
                   mg_last_error());                                                               \
            failures++;                                                                            \
            return;                                                                                \
        }                                                                                          \
    } while (0)

static uint32_t next(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(*s >> 33);
}

enum { BATCH = 3, KV_HEADS = 3, QO_HEADS = 5, HEAD_DIM = 48, PAGE = 7, PAGES = 12 };

typedef struct inputs {
    uint32_t tokens;
    uint16_t *k, *v, *q;
    int32_t positions[64], qo[BATCH + 1], kv[BATCH + 1], idx[PAGES], last[BATCH];
    float k_scale[KV_HEADS], v_scale[KV_HEADS];
} inputs;

/* Runs the append on `b` and reads back the pools and Q into `pool_out`, `q_out`. */
static void run(mg_backend *b, const inputs *in, mg_kv_dtype dtype, bool with_positions,
                uint8_t *pool_out, size_t pool_bytes, uint16_t *q_out) {
    mg_kv_cache_desc c = {KV_HEADS, HEAD_DIM, PAGE, PAGES, dtype};
    size_t row = (size_t)KV_HEADS * HEAD_DIM * 2, qrow = (size_t)QO_HEADS * HEAD_DIM * 2;
    mg_devptr pool, k, v, q, pos, qo, kv, idx, last, ks, vs, kp, vp;
    OK(mg_alloc(b, pool_bytes, &pool));
    OK(mg_memset(b, pool, 0xA5, pool_bytes)); /* poisoned: unwritten slots must stay so */
    OK(mg_kv_cache_pools(&c, pool, &kp, &vp));
    OK(mg_alloc(b, in->tokens * row, &k));
    OK(mg_alloc(b, in->tokens * row, &v));
    OK(mg_alloc(b, in->tokens * qrow, &q));
    OK(mg_alloc(b, sizeof in->positions, &pos));
    OK(mg_alloc(b, sizeof in->qo, &qo));
    OK(mg_alloc(b, sizeof in->kv, &kv));
    OK(mg_alloc(b, sizeof in->idx, &idx));
    OK(mg_alloc(b, sizeof in->last, &last));
    OK(mg_alloc(b, sizeof in->k_scale, &ks));
    OK(mg_alloc(b, sizeof in->v_scale, &vs));
    OK(mg_copy_h2d(b, k, in->k, in->tokens * row));
    OK(mg_copy_h2d(b, v, in->v, in->tokens * row));
    OK(mg_copy_h2d(b, q, in->q, in->tokens * qrow));
    OK(mg_copy_h2d(b, pos, in->positions, sizeof in->positions));
    OK(mg_copy_h2d(b, qo, in->qo, sizeof in->qo));
    OK(mg_copy_h2d(b, kv, in->kv, sizeof in->kv));
    OK(mg_copy_h2d(b, idx, in->idx, sizeof in->idx));
    OK(mg_copy_h2d(b, last, in->last, sizeof in->last));
    OK(mg_copy_h2d(b, ks, in->k_scale, sizeof in->k_scale));
    OK(mg_copy_h2d(b, vs, in->v_scale, sizeof in->v_scale));
    bool fp8 = dtype == MG_KV_FP8_E4M3;
    mg_kv_append_args a = {.batch_size = BATCH,
                           .num_tokens = in->tokens,
                           .num_kv_indices = (uint32_t)in->kv[BATCH],
                           .k = k,
                           .v = v,
                           .q = q,
                           .num_qo_heads = QO_HEADS,
                           .positions = with_positions ? pos : 0,
                           .rope = true,
                           .rope_theta = 10000.0f,
                           .qo_indptr = qo,
                           .kv_indptr = kv,
                           .kv_indices = idx,
                           .kv_last_page_len = last,
                           .k_pages = kp,
                           .v_pages = vp,
                           .k_scale = fp8 ? ks : 0,
                           .v_scale = fp8 ? vs : 0};
    OK(mg_kv_append(b, NULL, &c, &a));
    OK(mg_stream_synchronize(mg_stream_default(b)));
    OK(mg_copy_d2h(b, pool_out, pool, pool_bytes));
    OK(mg_copy_d2h(b, q_out, q, in->tokens * qrow));
    mg_devptr all[] = {pool, k, v, q, pos, qo, kv, idx, last, ks, vs};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        OK(mg_free(b, all[i]));
}

int main(void) {
    mg_backend *metal = NULL, *cpu = NULL;
    if (mg_backend_open(MG_BACKEND_METAL, 0, &metal) != MG_OK ||
        mg_backend_open(MG_BACKEND_CPU, 0, &cpu) != MG_OK) {
        printf("FAIL: opening the backends: %s\n", mg_last_error());
        return 1;
    }
    uint64_t seed = 0x6b76617070656e64ull;
    inputs in = {0};
    /* Requests of 5, 1 and 9 new tokens over 11, 1 and 30 cached ones (pages 2, 1, 5). */
    static const int32_t new_tokens[BATCH] = {5, 1, 9}, cached[BATCH] = {11, 1, 30};
    int32_t page = 0;
    for (int r = 0; r < BATCH; r++) {
        in.qo[r + 1] = in.qo[r] + new_tokens[r];
        int32_t pages = (cached[r] + PAGE - 1) / PAGE;
        in.kv[r + 1] = in.kv[r] + pages;
        in.last[r] = cached[r] - (pages - 1) * PAGE;
        for (int32_t p = 0; p < pages; p++)
            in.idx[in.kv[r] + p] = (page++ * 5) % PAGES; /* scattered pages */
    }
    in.tokens = (uint32_t)in.qo[BATCH] + 2; /* spare rows the kernel must not touch */
    size_t elems = (size_t)in.tokens * QO_HEADS * HEAD_DIM;
    in.k = malloc(elems * 2);
    in.v = malloc(elems * 2);
    in.q = malloc(elems * 2);
    for (size_t i = 0; i < elems; i++) {
        float f = ((float)(next(&seed) % 4001) - 2000.0f) / 500.0f;
        uint32_t bits;
        memcpy(&bits, &f, 4);
        in.k[i] = (uint16_t)(bits >> 16);
        in.v[i] = (uint16_t)((bits >> 16) ^ 0x8000u);
        in.q[i] = (uint16_t)((bits >> 16) + 3);
    }
    for (int i = 0; i < 64; i++)
        in.positions[i] = (int32_t)(next(&seed) % 5000);
    for (int h = 0; h < KV_HEADS; h++) {
        in.k_scale[h] = 0.01f + 0.003f * h;
        in.v_scale[h] = 0.02f - 0.004f * h;
    }
    for (int variant = 0; variant < 4; variant++) {
        mg_kv_dtype dtype = variant & 1 ? MG_KV_FP8_E4M3 : MG_KV_BF16;
        bool with_positions = variant & 2;
        mg_kv_cache_desc c = {KV_HEADS, HEAD_DIM, PAGE, PAGES, dtype};
        size_t pool_bytes = 0, qbytes = (size_t)in.tokens * QO_HEADS * HEAD_DIM * 2;
        mg_kv_cache_bytes(&c, &pool_bytes);
        uint8_t *pool_m = malloc(pool_bytes), *pool_c = malloc(pool_bytes);
        uint16_t *q_m = malloc(qbytes), *q_c = malloc(qbytes);
        memset(pool_m, 0, pool_bytes);
        memset(pool_c, 1, pool_bytes);
        int before = failures;
        run(metal, &in, dtype, with_positions, pool_m, pool_bytes, q_m);
        run(cpu, &in, dtype, with_positions, pool_c, pool_bytes, q_c);
        size_t written = 0;
        for (size_t i = 0; i < pool_bytes; i++)
            written += pool_c[i] != 0xA5;
        if (failures == before &&
            (memcmp(pool_m, pool_c, pool_bytes) || memcmp(q_m, q_c, qbytes) || written == 0)) {
            printf("FAIL: %s pools%s: metal and cpu differ (or nothing was written: %zu)\n",
                   dtype ? "fp8" : "bf16", with_positions ? ", positions" : "", written);
            failures++;
        } else if (failures == before) {
            printf("%s pools%s: %zu pool bytes written, identical on metal and cpu\n",
                   dtype ? "fp8" : "bf16", with_positions ? ", positions" : "", written);
        }
        free(pool_m);
        free(pool_c);
        free(q_m);
        free(q_c);
    }
    mg_backend_close(metal);
    mg_backend_close(cpu);
    free(in.k);
    free(in.v);
    free(in.q);
    return failures ? 1 : 0;
}
