/* test_attention_cpu.c - the CPU reference of the ragged prefill attention
 * (metrale/ops_attention.h) against an independent float64 implementation on fresh random
 * ragged batches, graph capture and re-plan on the CPU backend, and every validation error
 * (status, message, and nothing written). */
#include <math.h>

#include "metrale/dtype.h"
#include "metrale/launch.h"
#include "metrale/ops_attention.h"
#include "test_util.h"

#define POISON_BF16 0x7fc1u /* a NaN: any element the op forgets stays visibly wrong */

typedef struct batch {
    uint32_t batch_size, hq, hkv, d;
    bool causal;
    int32_t window_left;
    float sm_scale;
    int32_t *qo_indptr, *kv_indptr;
    uint32_t qo_rows, kv_rows; /* indptr ends */
    uint16_t *q, *k, *v;       /* host copies */
} batch;

static uint16_t random_bf16(void) {
    double u = (double)(test_rand() >> 11) / (double)(1ull << 53) * 2.0 - 1.0;
    return mg_f32_to_bf16((float)u);
}

/* Totals from the indptrs, and fresh random q, k, v for them. */
static void fill_batch_data(batch *b) {
    b->qo_rows = (uint32_t)b->qo_indptr[b->batch_size];
    b->kv_rows = (uint32_t)b->kv_indptr[b->batch_size];
    size_t nq = (size_t)b->qo_rows * b->hq * b->d, nk = (size_t)b->kv_rows * b->hkv * b->d;
    free(b->q), free(b->k), free(b->v);
    b->q = malloc(sizeof(uint16_t) * (nq + 1));
    b->k = malloc(sizeof(uint16_t) * (nk + 1));
    b->v = malloc(sizeof(uint16_t) * (nk + 1));
    for (size_t i = 0; i < nq; i++)
        b->q[i] = random_bf16();
    for (size_t i = 0; i < nk; i++) {
        b->k[i] = random_bf16();
        b->v[i] = random_bf16();
    }
}

/* Lengths: a mix of 0, 1, odd and larger values; kv >= qo with a random prefix. */
static void make_batch(batch *b, uint32_t batch_size, uint32_t hq, uint32_t hkv, uint32_t d,
                       bool causal, int32_t window_left, uint32_t max_len) {
    *b = (batch){.batch_size = batch_size,
                 .hq = hq,
                 .hkv = hkv,
                 .d = d,
                 .causal = causal,
                 .window_left = window_left,
                 .sm_scale = 1.0f / sqrtf((float)d)};
    b->qo_indptr = calloc(batch_size + 1, sizeof(int32_t));
    b->kv_indptr = calloc(batch_size + 1, sizeof(int32_t));
    for (uint32_t i = 0; i < batch_size; i++) {
        uint32_t pick = (uint32_t)test_rand_range(0, 5);
        uint32_t lq = pick == 0                  ? 0
                      : pick == 1 || max_len < 2 ? 1
                                                 : (uint32_t)test_rand_range(2, max_len) | 1u;
        uint32_t prefix = test_rand_range(0, 2) ? (uint32_t)test_rand_range(0, max_len) : 0;
        uint32_t lk = lq + prefix;
        if (!causal && test_rand_range(0, 4) == 0)
            lk = (uint32_t)test_rand_range(0, max_len); /* non-causal: kv may be shorter, even 0 */
        b->qo_indptr[i + 1] = b->qo_indptr[i] + (int32_t)lq;
        b->kv_indptr[i + 1] = b->kv_indptr[i] + (int32_t)lk;
    }
    fill_batch_data(b);
}

static void free_batch(batch *b) {
    free(b->qo_indptr);
    free(b->kv_indptr);
    free(b->q);
    free(b->k);
    free(b->v);
}

/* float64 attention: o[qo_rows][hq][d] and lse[qo_rows][hq] (base 2). */
static void reference_f64(const batch *b, double *o, double *lse) {
    const uint32_t d = b->d, group = b->hq / b->hkv;
    double *s = malloc(sizeof(double) * (b->kv_rows + 1));
    for (uint32_t i = 0; i < b->batch_size; i++) {
        int64_t q0 = b->qo_indptr[i], k0 = b->kv_indptr[i];
        int64_t lq = b->qo_indptr[i + 1] - q0, lk = b->kv_indptr[i + 1] - k0;
        for (int64_t r = 0; r < lq; r++)
            for (uint32_t h = 0; h < b->hq; h++) {
                const uint32_t kvh = h / group;
                int64_t pos = lk - lq + r, lo = 0, hi = lk; /* visible keys [lo, hi) */
                if (b->causal)
                    hi = pos + 1;
                if (b->window_left >= 0 && pos - b->window_left > lo)
                    lo = pos - b->window_left;
                hi = hi > lk ? lk : hi;
                double *out = o + ((size_t)(q0 + r) * b->hq + h) * d;
                for (uint32_t c = 0; c < d; c++)
                    out[c] = 0.0;
                if (lo >= hi) {
                    lse[(size_t)(q0 + r) * b->hq + h] = -INFINITY;
                    continue;
                }
                double m = -INFINITY, sum = 0.0;
                for (int64_t j = lo; j < hi; j++) {
                    double dot = 0.0;
                    for (uint32_t c = 0; c < d; c++)
                        dot +=
                            (double)mg_bf16_to_f32(b->q[((size_t)(q0 + r) * b->hq + h) * d + c]) *
                            (double)mg_bf16_to_f32(b->k[((size_t)(k0 + j) * b->hkv + kvh) * d + c]);
                    s[j] = dot * b->sm_scale;
                    m = s[j] > m ? s[j] : m;
                }
                for (int64_t j = lo; j < hi; j++) {
                    double e = exp(s[j] - m);
                    sum += e;
                    for (uint32_t c = 0; c < d; c++)
                        out[c] += e * (double)mg_bf16_to_f32(
                                          b->v[((size_t)(k0 + j) * b->hkv + kvh) * d + c]);
                }
                for (uint32_t c = 0; c < d; c++)
                    out[c] /= sum;
                lse[(size_t)(q0 + r) * b->hq + h] = (m + log(sum)) / log(2.0);
            }
    }
    free(s);
}

/* Device tensors of a batch; o and lse poisoned, with `guard_rows` poisoned rows past the end
 * of o that must stay untouched. */
typedef struct tensors {
    mg_devptr q, k, v, o, lse;
    size_t o_elems, lse_elems;
} tensors;

static mg_status upload(mg_backend *be, const batch *b, uint32_t guard_rows, tensors *t) {
    *t = (tensors){0};
    size_t nq = (size_t)b->qo_rows * b->hq * b->d, nk = (size_t)b->kv_rows * b->hkv * b->d;
    t->o_elems = nq + (size_t)guard_rows * b->hq * b->d;
    t->lse_elems = (size_t)(b->qo_rows + guard_rows) * b->hq;
    mg_status st = mg_alloc(be, 2 * (nq + 8), &t->q);
    if (!st)
        st = mg_alloc(be, 2 * (nk + 8), &t->k);
    if (!st)
        st = mg_alloc(be, 2 * (nk + 8), &t->v);
    if (!st)
        st = mg_alloc(be, 2 * (t->o_elems + 8), &t->o);
    if (!st)
        st = mg_alloc(be, 4 * (t->lse_elems + 8), &t->lse);
    if (!st && nq)
        st = mg_copy_h2d(be, t->q, b->q, 2 * nq);
    if (!st && nk)
        st = mg_copy_h2d(be, t->k, b->k, 2 * nk);
    if (!st && nk)
        st = mg_copy_h2d(be, t->v, b->v, 2 * nk);
    uint16_t *poison = malloc(2 * (t->o_elems + 1));
    float *lse_poison = malloc(4 * (t->lse_elems + 1));
    for (size_t i = 0; i < t->o_elems; i++)
        poison[i] = POISON_BF16;
    for (size_t i = 0; i < t->lse_elems; i++)
        lse_poison[i] = NAN;
    if (!st && t->o_elems)
        st = mg_copy_h2d(be, t->o, poison, 2 * t->o_elems);
    if (!st && t->lse_elems)
        st = mg_copy_h2d(be, t->lse, lse_poison, 4 * t->lse_elems);
    free(poison);
    free(lse_poison);
    return st;
}

static void free_tensors(mg_backend *be, tensors *t) {
    mg_free(be, t->q);
    mg_free(be, t->k);
    mg_free(be, t->v);
    mg_free(be, t->o);
    mg_free(be, t->lse);
}

static mg_attention_desc desc_of(const batch *b) {
    return (mg_attention_desc){.num_qo_heads = b->hq,
                               .num_kv_heads = b->hkv,
                               .head_dim = b->d,
                               .causal = b->causal,
                               .window_left = b->window_left,
                               .sm_scale = b->sm_scale};
}

/* Output rounded once to BF16 from an FP32 computation: half an ulp of BF16 plus FP32 noise. */
static void compare_with_f64(mg_backend *be, const batch *b, const tensors *t, uint32_t guard_rows,
                             const char *what) {
    size_t nq = (size_t)b->qo_rows * b->hq * b->d, nl = (size_t)b->qo_rows * b->hq;
    uint16_t *o = malloc(2 * (t->o_elems + 1));
    float *lse = malloc(4 * (t->lse_elems + 1));
    double *ro = malloc(sizeof(double) * (nq + 1)), *rl = malloc(sizeof(double) * (nl + 1));
    CHECK_OK(mg_copy_d2h(be, o, t->o, 2 * t->o_elems));
    CHECK_OK(mg_copy_d2h(be, lse, t->lse, 4 * t->lse_elems));
    reference_f64(b, ro, rl);
    size_t bad = 0, first = 0;
    double worst = 0.0;
    for (size_t i = 0; i < nq; i++) {
        double got = mg_bf16_to_f32(o[i]), err = fabs(got - ro[i]);
        double bound = ldexp(fabs(ro[i]), -8) + 1e-5;
        if (!(err <= bound) && bad++ == 0)
            first = i;
        worst = err > worst ? err : worst;
    }
    for (size_t i = 0; i < nl; i++) {
        bool both_inf = isinf(rl[i]) && isinf(lse[i]) && lse[i] < 0;
        if (!both_inf && !(fabs(lse[i] - rl[i]) <= 1e-4 * fmax(1.0, fabs(rl[i]))) && bad++ == 0)
            first = nq + i;
    }
    size_t touched = 0;
    for (size_t i = nq; i < t->o_elems; i++)
        touched += o[i] != POISON_BF16;
    for (size_t i = nl; i < t->lse_elems; i++)
        touched += !isnan(lse[i]);
    test_checks += 2;
    if (bad) {
        test_failures++;
        fprintf(stderr,
                "FAIL %s: %zu elements off the float64 reference (first at %zu, worst o "
                "error %.3g)\n",
                what, bad, first, worst);
    }
    if (touched) {
        test_failures++;
        fprintf(stderr, "FAIL %s: %zu elements written past the batch's rows (%u guard rows)\n",
                what, touched, guard_rows);
    }
    free(o);
    free(lse);
    free(ro);
    free(rl);
}

static void test_against_f64(mg_backend *be) {
    static const struct {
        uint32_t batch, hq, hkv, d, max_len;
        bool causal;
        int32_t window;
    } cases[] = {
        {5, 4, 4, 128, 67, true, -1},   {7, 8, 2, 128, 45, false, -1}, {4, 8, 1, 128, 90, true, 17},
        {6, 4, 1, 64, 33, true, 5},     {3, 2, 2, 128, 140, true, 0},  {1, 8, 8, 128, 1, true, -1},
        {9, 16, 2, 128, 21, false, -1}, {2, 4, 2, 256, 40, true, 63},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        batch b;
        make_batch(&b, cases[c].batch, cases[c].hq, cases[c].hkv, cases[c].d, cases[c].causal,
                   cases[c].window, cases[c].max_len);
        char what[96];
        snprintf(what, sizeof what, "case %zu (B=%u Hq=%u Hkv=%u D=%u causal=%d window=%d)", c,
                 b.batch_size, b.hq, b.hkv, b.d, b.causal, b.window_left);
        tensors t;
        CHECK_OK(upload(be, &b, 3, &t));
        mg_attention_desc desc = desc_of(&b);
        mg_attention_plan *p = NULL;
        CHECK_OK(
            mg_attention_plan_create(be, &desc, b.qo_indptr, b.kv_indptr, b.batch_size, NULL, &p));
        mg_attention_tensors at = {.q = t.q,
                                   .k = t.k,
                                   .v = t.v,
                                   .o = t.o,
                                   .lse = t.lse,
                                   .qo_rows = b.qo_rows,
                                   .kv_rows = b.kv_rows};
        CHECK_OK(mg_attention_run(p, &at, NULL));
        CHECK_OK(mg_stream_synchronize(mg_stream_default(be)));
        compare_with_f64(be, &b, &t, 3, what);
        CHECK(mg_attention_plan_flops(p) >= 0.0);
        mg_attention_plan_destroy(p);
        free_tensors(be, &t);
        free_batch(&b);
    }
}

/* Fixed-grid plan: capture a run, re-plan a different batch of the same size, replay. */
static void test_graph_replay(mg_backend *be) {
    batch first, second;
    make_batch(&first, 4, 4, 2, 128, true, -1, 30);
    make_batch(&second, 4, 4, 2, 128, true, -1, 30);
    const uint32_t cap_q = first.qo_rows > second.qo_rows ? first.qo_rows : second.qo_rows;
    const uint32_t cap_k = first.kv_rows > second.kv_rows ? first.kv_rows : second.kv_rows;
    /* Both batches live in buffers of the capacity; a replay must compute the second. */
    tensors t;
    batch cap = second;
    cap.qo_rows = cap_q, cap.kv_rows = cap_k;
    size_t nq = (size_t)cap_q * 4 * 128, nk = (size_t)cap_k * 2 * 128;
    uint16_t *q = calloc(nq + 1, 2), *k = calloc(nk + 1, 2), *v = calloc(nk + 1, 2);
    memcpy(q, second.q, 2 * (size_t)second.qo_rows * 4 * 128);
    memcpy(k, second.k, 2 * (size_t)second.kv_rows * 2 * 128);
    memcpy(v, second.v, 2 * (size_t)second.kv_rows * 2 * 128);
    cap.q = q, cap.k = k, cap.v = v;
    CHECK_OK(upload(be, &cap, 0, &t));
    mg_attention_desc desc = desc_of(&first);
    desc.graph_qo_rows = cap_q;
    desc.graph_kv_rows = cap_k;
    mg_stream *s = NULL;
    mg_attention_plan *p = NULL;
    mg_graph *g = NULL;
    CHECK_OK(mg_stream_create(be, &s));
    CHECK_OK(mg_attention_plan_create(be, &desc, first.qo_indptr, first.kv_indptr, 4, s, &p));
    mg_attention_tensors at = {
        .q = t.q, .k = t.k, .v = t.v, .o = t.o, .lse = t.lse, .qo_rows = cap_q, .kv_rows = cap_k};
    CHECK_OK(mg_graph_begin_capture(s));
    CHECK_OK(mg_attention_run(p, &at, s));
    CHECK_STATUS(mg_attention_plan_update(p, second.qo_indptr, second.kv_indptr, 4, s),
                 MG_ERR_CAPTURING);
    CHECK_OK(mg_graph_end_capture(s, &g));
    CHECK_OK(mg_attention_plan_update(p, second.qo_indptr, second.kv_indptr, 4, s));
    CHECK_OK(mg_graph_launch(g, s));
    CHECK_OK(mg_stream_synchronize(s));
    /* Rows past the second batch's totals stay poisoned. */
    batch view = second;
    tensors tv = t;
    tv.o_elems = nq;
    tv.lse_elems = (size_t)cap_q * 4;
    compare_with_f64(be, &view, &tv, cap_q - second.qo_rows, "graph replay after re-plan");
    /* A fixed-grid plan keeps its batch size and runs on its capacities. */
    CHECK_STATUS(mg_attention_plan_update(p, second.qo_indptr, second.kv_indptr, 3, s),
                 MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("keeps its batch_size");
    at.qo_rows = second.qo_rows;
    if (second.qo_rows != cap_q) {
        CHECK_STATUS(mg_attention_run(p, &at, s), MG_ERR_INVALID_ARGUMENT);
        CHECK_MESSAGE("capacities");
    }
    mg_graph_destroy(g);
    mg_attention_plan_destroy(p);
    mg_stream_destroy(s);
    free_tensors(be, &t);
    free(q), free(k), free(v);
    free_batch(&first);
    free_batch(&second);
}

/* Every bad argument: the status, a message naming it, and the poisoned output untouched. */
static void test_validation(mg_backend *be, mg_backend *other) {
    batch b;
    make_batch(&b, 3, 4, 2, 128, true, -1, 12);
    b.qo_indptr[1] = b.qo_indptr[0] + 2, b.qo_indptr[2] = b.qo_indptr[1] + 1;
    b.qo_indptr[3] = b.qo_indptr[2] + 3;
    b.kv_indptr[1] = 5, b.kv_indptr[2] = 6, b.kv_indptr[3] = 10;
    fill_batch_data(&b);
    tensors t;
    CHECK_OK(upload(be, &b, 2, &t));
    mg_attention_desc desc = desc_of(&b), bad;
    mg_attention_plan *p = NULL;
    int32_t qo[4], kv[4];

#define EXPECT_PLAN_ERROR(mutate, needle)                                                          \
    do {                                                                                           \
        bad = desc;                                                                                \
        memcpy(qo, b.qo_indptr, sizeof qo);                                                        \
        memcpy(kv, b.kv_indptr, sizeof kv);                                                        \
        mutate;                                                                                    \
        mg_attention_plan *never = (mg_attention_plan *)&t;                                        \
        CHECK_STATUS(mg_attention_plan_create(be, &bad, qo, kv, 3, NULL, &never),                  \
                     MG_ERR_INVALID_ARGUMENT);                                                     \
        CHECK_MESSAGE(needle);                                                                     \
        CHECK(never == NULL);                                                                      \
    } while (0)

    EXPECT_PLAN_ERROR(qo[0] = 1, "qo_indptr[0] = 1");
    EXPECT_PLAN_ERROR(kv[0] = -1, "kv_indptr[0] = -1");
    EXPECT_PLAN_ERROR(qo[2] = 1, "qo_indptr decreases at request 1");
    EXPECT_PLAN_ERROR(kv[3] = 4, "kv_indptr decreases at request 2");
    EXPECT_PLAN_ERROR(kv[1] = 1, "request 0 has 2 queries but only 1 keys");
    EXPECT_PLAN_ERROR(bad.num_kv_heads = 3, "does not divide");
    EXPECT_PLAN_ERROR(bad.num_qo_heads = 0, "head counts must be positive");
    EXPECT_PLAN_ERROR(bad.head_dim = 100, "head_dim 100");
    EXPECT_PLAN_ERROR(bad.head_dim = 1024, "head_dim 1024");
    EXPECT_PLAN_ERROR(bad.window_left = -2, "window_left -2");
    EXPECT_PLAN_ERROR((bad.causal = false, bad.window_left = 4), "window_left 4 needs causal");
    EXPECT_PLAN_ERROR(bad.sm_scale = NAN, "sm_scale");
    EXPECT_PLAN_ERROR(bad.sm_scale = 0.0f, "sm_scale");
    EXPECT_PLAN_ERROR(bad.graph_qo_rows = 6, "graph_kv_rows");
    EXPECT_PLAN_ERROR((bad.graph_qo_rows = 5, bad.graph_kv_rows = 10), "capacities 5 and 10");
    EXPECT_PLAN_ERROR(bad.impl = (mg_attention_impl)7, "unknown impl 7");
#undef EXPECT_PLAN_ERROR
    mg_attention_plan *never = NULL;
    CHECK_STATUS(mg_attention_plan_create(be, &desc, NULL, b.kv_indptr, 3, NULL, &never),
                 MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("NULL qo_indptr");
    CHECK_STATUS(mg_attention_plan_create(be, &desc, b.qo_indptr, b.kv_indptr, 0, NULL, &never),
                 MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("batch_size 0");
    CHECK_STATUS(mg_attention_plan_create(be, NULL, b.qo_indptr, b.kv_indptr, 3, NULL, &never),
                 MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("NULL descriptor");
    CHECK_STATUS(mg_attention_plan_create(NULL, &desc, b.qo_indptr, b.kv_indptr, 3, NULL, &never),
                 MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("invalid or closed backend");
    mg_stream *foreign = NULL;
    CHECK_OK(mg_stream_create(other, &foreign));
    CHECK_STATUS(mg_attention_plan_create(be, &desc, b.qo_indptr, b.kv_indptr, 3, foreign, &never),
                 MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("not a stream of the plan's backend");
    mg_stream *s = NULL;
    CHECK_OK(mg_stream_create(be, &s));
    CHECK_OK(mg_graph_begin_capture(s));
    CHECK_STATUS(mg_attention_plan_create(be, &desc, b.qo_indptr, b.kv_indptr, 3, s, &never),
                 MG_ERR_CAPTURING);
    CHECK_OK(mg_graph_abort_capture(s));

    /* Run-time errors on a valid plan. */
    CHECK_OK(mg_attention_plan_create(be, &desc, b.qo_indptr, b.kv_indptr, 3, NULL, &p));
    mg_attention_tensors
        good = {.q = t.q, .k = t.k, .v = t.v, .o = t.o, .lse = t.lse, .qo_rows = 6, .kv_rows = 10},
        at;
#define EXPECT_RUN_ERROR(mutate, needle)                                                           \
    do {                                                                                           \
        at = good;                                                                                 \
        mutate;                                                                                    \
        CHECK_STATUS(mg_attention_run(p, &at, NULL), MG_ERR_INVALID_ARGUMENT);                     \
        CHECK_MESSAGE(needle);                                                                     \
    } while (0)
    EXPECT_RUN_ERROR(at.qo_rows = 7, "qo_rows 7");
    EXPECT_RUN_ERROR(at.kv_rows = 9, "kv_rows 9");
    EXPECT_RUN_ERROR(at.q = 0, "q is null");
    EXPECT_RUN_ERROR(at.o = 0, "o is null");
    EXPECT_RUN_ERROR(at.k = t.k + 2, "k 0x");
    EXPECT_RUN_ERROR(at.v = t.v + 8, "16-byte aligned");
    EXPECT_RUN_ERROR(at.lse = t.lse + 2, "lse 0x");
    /* Tensors too short for their rows: the op refuses before launching anything. */
    mg_devptr short_o = 0;
    CHECK_OK(mg_alloc(be, 2 * 6 * 4 * 128 - 16, &short_o));
    EXPECT_RUN_ERROR(at.o = short_o, "o range");
    CHECK_MESSAGE("overruns its allocation");
    mg_free(be, short_o);
    mg_devptr short_k = 0; /* one element short of 10 rows x 2 heads x 128 */
    CHECK_OK(mg_alloc(be, 10 * 2 * 128 * 2 - 2, &short_k));
    EXPECT_RUN_ERROR(at.k = short_k, "k range");
    mg_free(be, short_k);
    CHECK_STATUS(mg_attention_run(p, &good, foreign), MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("not a stream of the plan's backend");
    CHECK_STATUS(mg_attention_run(NULL, &good, NULL), MG_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(mg_attention_run(p, NULL, NULL), MG_ERR_INVALID_ARGUMENT);
#undef EXPECT_RUN_ERROR

    /* A rejected update keeps the previous plan. */
    memcpy(qo, b.qo_indptr, sizeof qo);
    qo[3] = 99;
    CHECK_STATUS(mg_attention_plan_update(p, qo, b.kv_indptr, 3, NULL), MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("request 2 has");
    mg_attention_plan_info info;
    CHECK_OK(mg_attention_plan_get_info(p, &info));
    CHECK(info.batch_size == 3 && info.qo_total == 6 && info.kv_total == 10);

    /* Nothing above wrote the output: all of o and lse still poisoned. */
    uint16_t *o = malloc(2 * t.o_elems);
    float *lse = malloc(4 * t.lse_elems);
    CHECK_OK(mg_copy_d2h(be, o, t.o, 2 * t.o_elems));
    CHECK_OK(mg_copy_d2h(be, lse, t.lse, 4 * t.lse_elems));
    size_t written = 0;
    for (size_t i = 0; i < t.o_elems; i++)
        written += o[i] != POISON_BF16;
    for (size_t i = 0; i < t.lse_elems; i++)
        written += !isnan(lse[i]);
    CHECK(written == 0);
    /* And the plan still computes its batch. */
    CHECK_OK(mg_attention_run(p, &good, NULL));
    CHECK_OK(mg_stream_synchronize(mg_stream_default(be)));
    compare_with_f64(be, &b, &t, 2, "after rejected calls");
    free(o);
    free(lse);
    mg_attention_plan_destroy(p);
    mg_stream_destroy(s);
    mg_stream_destroy(foreign);
    free_tensors(be, &t);
    free_batch(&b);
}

/* Huge shapes are errors, never wrapped spans: through the plan API (head count bound, rows
 * far beyond the buffers) and through the public kernel itself, whose arguments anyone can
 * pass. The poisoned output must stay untouched. */
static void test_size_overflow(mg_backend *be) {
    const int32_t small_qo[2] = {0, 1}, small_kv[2] = {0, 1};
    mg_attention_desc desc = {.num_qo_heads = 0x80000000u,
                              .num_kv_heads = 1,
                              .head_dim = 512,
                              .window_left = -1,
                              .sm_scale = 0.04f};
    mg_attention_plan *p = NULL;
    CHECK_STATUS(mg_attention_plan_create(be, &desc, small_qo, small_kv, 1, NULL, &p),
                 MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("num_qo_heads 2147483648 exceeds the limit of 1024");
    CHECK(p == NULL);
    desc.num_qo_heads = 1025;
    CHECK_STATUS(mg_attention_plan_create(be, &desc, small_qo, small_kv, 1, NULL, &p),
                 MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("num_qo_heads 1025");

    /* The largest heads allowed and INT32_MAX rows: planned (nothing is allocated for rows),
     * but a run on small buffers is refused by the range checks. */
    desc.num_qo_heads = 1024, desc.num_kv_heads = 1024;
    const int32_t huge[2] = {0, INT32_MAX};
    mg_devptr buf = 0, o = 0;
    CHECK_OK(mg_alloc(be, 4096, &buf));
    CHECK_OK(mg_alloc(be, 4096, &o));
    uint16_t poison[2048];
    for (size_t i = 0; i < 2048; i++)
        poison[i] = POISON_BF16;
    CHECK_OK(mg_copy_h2d(be, o, poison, sizeof poison));
    CHECK_OK(mg_attention_plan_create(be, &desc, huge, huge, 1, NULL, &p));
    mg_attention_tensors at = {
        .q = buf, .k = buf, .v = buf, .o = o, .qo_rows = INT32_MAX, .kv_rows = INT32_MAX};
    CHECK_STATUS(mg_attention_run(p, &at, NULL), MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("q range");

    /* The kernel launched directly (registered by the plan above) with sizes whose byte spans
     * wrap 64 bits: 2^16 rows x 2^24 heads x 2^24 x 2 bytes = 2^65. */
    mg_kernel *kernel = NULL;
    mg_devptr indptrs = 0;
    const int32_t one[4] = {0, 1, 0, 1};
    CHECK_OK(mg_kernel_lookup(be, "metrale", "attention_ragged_prefill", &kernel));
    CHECK_OK(mg_alloc(be, sizeof one, &indptrs));
    CHECK_OK(mg_copy_h2d(be, indptrs, one, sizeof one));
    const struct {
        uint32_t rows, heads, head_dim;
    } wraps[] = {{1u << 16, 1u << 24, 1u << 24}, {0xffffffffu, 0x80000000u, 0x80000000u}};
    for (size_t i = 0; kernel && i < sizeof wraps / sizeof wraps[0]; i++) {
        mg_launch l;
        mg_launch_init(&l, (mg_dim3){1, 1, 1}, (mg_dim3){1, 1, 1}, 0);
        mg_launch_arg_ptr(&l, buf);
        mg_launch_arg_ptr(&l, buf);
        mg_launch_arg_ptr(&l, buf);
        mg_launch_arg_ptr(&l, o);
        mg_launch_arg_ptr(&l, 0);
        mg_launch_arg_ptr(&l, indptrs);
        mg_launch_arg_u32(&l, 1);                 /* batch */
        mg_launch_arg_u32(&l, wraps[i].heads);    /* qo heads */
        mg_launch_arg_u32(&l, wraps[i].heads);    /* kv heads */
        mg_launch_arg_u32(&l, wraps[i].head_dim); /* head_dim */
        mg_launch_arg_u32(&l, 0);
        mg_launch_arg_i32(&l, -1);
        mg_launch_arg_f32(&l, 1.0f);
        mg_launch_arg_u32(&l, wraps[i].rows);
        mg_launch_arg_u32(&l, wraps[i].rows);
        mg_launch_arg_u32(&l, 0);
        CHECK_STATUS(mg_launch_run(be, kernel, NULL, &l), MG_ERR_INVALID_ARGUMENT);
        CHECK_MESSAGE("overflows the address space");
    }
    uint16_t after[2048];
    CHECK_OK(mg_copy_d2h(be, after, o, sizeof after));
    CHECK(memcmp(after, poison, sizeof after) == 0);
    if (kernel)
        mg_kernel_release(kernel);
    mg_attention_plan_destroy(p);
    mg_free(be, indptrs);
    mg_free(be, buf);
    mg_free(be, o);
}

/* An eager plan is never captured (a later update may free the workspaces a graph would
 * keep); refused before anything is recorded, it still runs once the capture is over. */
static void test_eager_capture_refused(mg_backend *be) {
    batch b;
    make_batch(&b, 3, 4, 2, 64, true, -1, 20);
    tensors t;
    CHECK_OK(upload(be, &b, 2, &t));
    mg_attention_desc desc = desc_of(&b);
    mg_attention_plan *p = NULL;
    mg_stream *s = NULL;
    mg_graph *g = NULL;
    CHECK_OK(mg_stream_create(be, &s));
    CHECK_OK(mg_attention_plan_create(be, &desc, b.qo_indptr, b.kv_indptr, 3, s, &p));
    mg_attention_tensors at = {.q = t.q,
                               .k = t.k,
                               .v = t.v,
                               .o = t.o,
                               .lse = t.lse,
                               .qo_rows = b.qo_rows,
                               .kv_rows = b.kv_rows};
    CHECK_OK(mg_graph_begin_capture(s));
    CHECK_STATUS(mg_attention_run(p, &at, s), MG_ERR_CAPTURING);
    CHECK_MESSAGE("an eager plan");
    CHECK_OK(mg_graph_end_capture(s, &g));
    /* The graph recorded nothing: replaying it leaves the output poisoned. */
    CHECK_OK(mg_graph_launch(g, s));
    CHECK_OK(mg_stream_synchronize(s));
    uint16_t *o = malloc(2 * (t.o_elems + 1));
    CHECK_OK(mg_copy_d2h(be, o, t.o, 2 * t.o_elems));
    size_t written = 0;
    for (size_t i = 0; i < t.o_elems; i++)
        written += o[i] != POISON_BF16;
    CHECK(written == 0);
    free(o);
    CHECK_OK(mg_attention_run(p, &at, s));
    CHECK_OK(mg_stream_synchronize(s));
    compare_with_f64(be, &b, &t, 2, "eager run after a refused capture");
    mg_graph_destroy(g);
    mg_attention_plan_destroy(p);
    mg_stream_destroy(s);
    free_tensors(be, &t);
    free_batch(&b);
}

/* A plan outliving its backend: mg_backend_close freed the backend (and the plan's device
 * memory), so update and run refuse without touching it, and destroy frees host memory only.
 * Under AddressSanitizer any access to the closed backend is a reported use after free. */
static void test_plan_outlives_backend(void) {
    mg_backend *be = NULL;
    CHECK_OK(mg_backend_open(MG_BACKEND_CPU, 1, &be));
    if (!be)
        return;
    batch b;
    make_batch(&b, 2, 2, 1, 64, true, -1, 9);
    tensors t;
    CHECK_OK(upload(be, &b, 0, &t));
    mg_attention_desc desc = desc_of(&b);
    mg_attention_plan *p = NULL;
    CHECK_OK(mg_attention_plan_create(be, &desc, b.qo_indptr, b.kv_indptr, 2, NULL, &p));
    mg_attention_tensors at = {.q = t.q,
                               .k = t.k,
                               .v = t.v,
                               .o = t.o,
                               .lse = t.lse,
                               .qo_rows = b.qo_rows,
                               .kv_rows = b.kv_rows};
    CHECK_OK(mg_attention_run(p, &at, NULL));
    CHECK_OK(mg_backend_close(be)); /* frees the tensors and the plan's indptr buffer too */
    CHECK_STATUS(mg_attention_plan_update(p, b.qo_indptr, b.kv_indptr, 2, NULL),
                 MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("backend");
    CHECK_MESSAGE("was closed");
    CHECK_STATUS(mg_attention_run(p, &at, NULL), MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("was closed");
    mg_attention_plan_info info;
    CHECK_OK(mg_attention_plan_get_info(p, &info));
    CHECK(info.batch_size == 2);
    CHECK_OK(mg_attention_plan_destroy(p));
    free_batch(&b);
}

int main(void) {
    test_seed();
    mg_backend *be = NULL, *other = NULL;
    CHECK_OK(mg_backend_open(MG_BACKEND_CPU, 0, &be));
    CHECK_OK(mg_backend_open(MG_BACKEND_CPU, 1, &other));
    if (!be || !other)
        return test_finish();
    test_against_f64(be);
    test_graph_replay(be);
    test_validation(be, other);
    test_size_overflow(be);
    test_eager_capture_refused(be);
    uint64_t live_bytes = 0, live_count = 0;
    CHECK_OK(mg_ledger_live(be, &live_bytes, &live_count));
    CHECK(live_count == 0);
    mg_backend_close(other);
    test_plan_outlives_backend(); /* opens device 1 again, now that `other` is closed */
    mg_backend_close(be);
    return test_finish();
}
