/*
 * test_op_arguments.c - the argument checks of the ops (metrale/ops_gemm.h,
 * metrale/ops_attention.h) that test_gemm_cpu and test_attention_cpu do not reach: plans
 * given to mg_gemm_prewarm (kinds, output types, block modes, pointer alignments), every
 * operand's alignment and range, the FP8 scale transpose's shape and overlap rules, the
 * batch-invariant switch, scale counts, and the attention plan's and run's NULL and range
 * checks, and the GEMM kind table. Each refused call asserts its status and message and that
 * its output is untouched.
 */
#include <stdint.h>
#include <string.h>

#include "metrale/dtype.h"
#include "metrale/gpu.h"
#include "metrale/ops_attention.h"
#include "metrale/ops_gemm.h"
#include "test_util.h"

#define CHECK_ERROR(expr, status, needle)                                                          \
    do {                                                                                           \
        mg_clear_error();                                                                          \
        CHECK_STATUS(expr, status);                                                                \
        CHECK_MESSAGE(needle);                                                                     \
    } while (0)

static void test_prewarm_plans(mg_backend *b) {
    mg_stream *s = NULL;
    CHECK_OK(mg_stream_create(b, &s));
    const mg_gemm_plan good = {.kind = MG_GEMM_FP8_BLOCKSCALED,
                               .m = 4,
                               .n = 16,
                               .k = 128,
                               .ldc = 16,
                               .out_type = MG_DTYPE_BF16,
                               .act_mode = MG_FP8_BLOCK_1X128,
                               .weight_mode = MG_FP8_BLOCK_128X128};
    CHECK_OK(mg_gemm_prewarm(b, s, &good, 1));
    CHECK_OK(mg_gemm_prewarm(b, s, NULL, 0));
    CHECK_ERROR(mg_gemm_prewarm(b, s, NULL, 2), MG_ERR_INVALID_ARGUMENT, "NULL plans");
    CHECK_ERROR(mg_gemm_prewarm(NULL, s, &good, 1), MG_ERR_INVALID_ARGUMENT,
                "NULL, invalid or closed backend");

    struct {
        mg_gemm_plan plan;
        mg_status status;
        const char *needle;
    } bad[] = {
        {{.kind = (mg_gemm_kind)9, .m = 1, .n = 1, .k = 1, .ldc = 1},
         MG_ERR_INVALID_ARGUMENT,
         "unknown GEMM kind 9"},
        {{.kind = MG_GEMM_BF16, .m = 1, .n = 0, .k = 1, .ldc = 1, .out_type = MG_DTYPE_BF16},
         MG_ERR_INVALID_ARGUMENT,
         "mg_gemm_bf16: empty shape M=1 N=0 K=1"},
        {{.kind = MG_GEMM_BF16, .m = 1, .n = 1, .k = 0, .ldc = 1, .out_type = MG_DTYPE_BF16},
         MG_ERR_INVALID_ARGUMENT,
         "empty shape M=1 N=1 K=0"},
        {{.kind = MG_GEMM_FP8_TENSORWISE,
          .m = 1,
          .n = 16,
          .k = 16,
          .ldc = 16,
          .out_type = MG_DTYPE_F32},
         MG_ERR_INVALID_ARGUMENT,
         "mg_gemm_fp8_tensorwise: output type f32, expected bf16"},
        {{.kind = MG_GEMM_FP8_ROWWISE,
          .m = 1,
          .n = 16,
          .k = 24,
          .ldc = 16,
          .out_type = MG_DTYPE_BF16},
         MG_ERR_INVALID_ARGUMENT,
         "FP8 needs K and N multiples of 16, got N=16 K=24"},
        {{.kind = MG_GEMM_FP8_BLOCKSCALED,
          .m = 4,
          .n = 16,
          .k = 16,
          .ldc = 16,
          .out_type = MG_DTYPE_BF16,
          .act_mode = (mg_fp8_block_scale)5},
         MG_ERR_INVALID_ARGUMENT,
         "unknown block scale mode (act 5, weight 0)"},
        {{.kind = MG_GEMM_FP8_BLOCKSCALED,
          .m = 4,
          .n = 16,
          .k = 16,
          .ldc = 16,
          .out_type = MG_DTYPE_BF16,
          .weight_mode = (mg_fp8_block_scale)6},
         MG_ERR_INVALID_ARGUMENT,
         "unknown block scale mode (act 0, weight 6)"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        mg_gemm_plan plans[2] = {good, bad[i].plan};
        CHECK_ERROR(mg_gemm_prewarm(b, s, plans, 2), bad[i].status, bad[i].needle);
        CHECK_MESSAGE("(mg_gemm_prewarm: plan 1)");
    }
    static const uint32_t alignments[] = {0, 1, 2, 4, 8, 16};
    for (size_t i = 0; i < sizeof alignments / sizeof alignments[0]; i++) {
        mg_gemm_plan p = good;
        p.pointer_alignment = alignments[i];
        CHECK_OK(mg_gemm_prewarm(b, s, &p, 1));
    }
    static const uint32_t bad_alignments[] = {3, 32, 12};
    for (size_t i = 0; i < sizeof bad_alignments / sizeof bad_alignments[0]; i++) {
        mg_gemm_plan p = good;
        p.pointer_alignment = bad_alignments[i];
        char want[80];
        snprintf(want, sizeof want, "plan 0: pointer_alignment %u is not 0 or a power",
                 bad_alignments[i]);
        CHECK_ERROR(mg_gemm_prewarm(b, s, &p, 1), MG_ERR_INVALID_ARGUMENT, want);
    }
    CHECK_OK(mg_graph_begin_capture(s));
    CHECK_ERROR(mg_gemm_prewarm(b, s, &good, 1), MG_ERR_CAPTURING, "mg_gemm_prewarm");
    CHECK_OK(mg_graph_abort_capture(s));

    /* scale counts: none for BF16, one per tensor, one per row, per block */
    mg_gemm_plan p = good;
    p.kind = MG_GEMM_BF16;
    CHECK(mg_gemm_scale_count(&p, true) == 0);
    p.kind = MG_GEMM_FP8_TENSORWISE;
    CHECK(mg_gemm_scale_count(&p, false) == 1);
    p.kind = MG_GEMM_FP8_ROWWISE;
    CHECK(mg_gemm_scale_count(&p, true) == 4 && mg_gemm_scale_count(&p, false) == 16);
    p.kind = (mg_gemm_kind)9;
    CHECK(mg_gemm_scale_count(&p, true) == 0);

    /* operand quantization follows the kind: one scale per row here; none for BF16 */
    uint16_t values[2 * 40];
    uint8_t codes[2 * 40];
    float scales[2] = {-1.0f, -1.0f};
    for (size_t i = 0; i < 80; i++)
        values[i] = mg_f32_to_bf16((float)i - 30.0f);
    p.kind = MG_GEMM_FP8_ROWWISE;
    p.k = 40;
    CHECK_OK(mg_gemm_quantize_operand(&p, false, values, 2, codes, scales));
    CHECK(scales[0] == 30.0f / 448.0f && scales[1] == 49.0f / 448.0f);
    p.kind = MG_GEMM_BF16;
    CHECK_ERROR(mg_gemm_quantize_operand(&p, true, values, 2, codes, scales),
                MG_ERR_INVALID_ARGUMENT, "has no FP8 operands");
    CHECK_ERROR(mg_gemm_quantize_operand(NULL, true, values, 2, codes, scales),
                MG_ERR_INVALID_ARGUMENT, "plan is NULL");
    CHECK_OK(mg_stream_destroy(s));
}

/* A GEMM whose operands are refused writes nothing: `out` keeps its poison. */
static void test_gemm_operands(mg_backend *b) {
    const uint32_t m = 4, n = 16, k = 16;
    mg_devptr act = 0, weight = 0, out = 0, scales = 0;
    CHECK_OK(mg_alloc(b, m * k, &act));
    CHECK_OK(mg_alloc(b, n * k, &weight));
    CHECK_OK(mg_alloc(b, m * n * 2, &out));
    CHECK_OK(mg_alloc(b, 256, &scales));
    CHECK_OK(mg_memset(b, out, 0x5c, m * n * 2));

    CHECK_ERROR(mg_gemm_fp8_rowwise(b, NULL, m, n, k, act, scales, weight + 8, scales + 64, out, n),
                MG_ERR_INVALID_ARGUMENT, "mg_gemm_fp8_rowwise: weight 0x");
    CHECK_MESSAGE("is not 16-byte aligned");
    CHECK_ERROR(mg_gemm_fp8_rowwise(b, NULL, m, n, k, act, scales + 4, weight, scales + 64, out, n),
                MG_ERR_INVALID_ARGUMENT, "act_scale 0x");
    CHECK_ERROR(
        mg_gemm_fp8_tensorwise(b, NULL, m, n, k, act, scales + 4, weight, scales + 2, out, n),
        MG_ERR_INVALID_ARGUMENT, "weight_scale 0x");
    CHECK_MESSAGE("is not 4-byte aligned");
    CHECK_ERROR(mg_gemm_fp8_rowwise(b, NULL, m, n, k, act, scales, weight, 0, out, n),
                MG_ERR_INVALID_ARGUMENT, "weight_scale is null");
    /* weight one row short; scales past their buffer */
    CHECK_ERROR(mg_gemm_fp8_tensorwise(b, NULL, m, n + 16, k, act, scales, weight, scales + 16, out,
                                       n + 16),
                MG_ERR_INVALID_ARGUMENT, "weight range");
    mg_devptr two_scales = 0; /* rowwise needs m = 4 */
    CHECK_OK(mg_alloc(b, 8, &two_scales));
    CHECK_ERROR(mg_gemm_fp8_rowwise(b, NULL, m, n, k, act, two_scales, weight, scales, out, n),
                MG_ERR_INVALID_ARGUMENT, "act_scale range");
    CHECK_OK(mg_free(b, two_scales));
    CHECK_ERROR(mg_gemm_fp8_rowwise(b, NULL, m, n, k, act, scales, weight, scales + 208, out, n),
                MG_ERR_INVALID_ARGUMENT, "weight_scale range");
    CHECK_ERROR(mg_gemm_fp8_blockscaled(b, NULL, 6, n, k, act, scales, MG_FP8_BLOCK_1X128, weight,
                                        scales + 64, MG_FP8_BLOCK_1X128, out, n),
                MG_ERR_INVALID_ARGUMENT, "block scaling needs M a multiple of 4, got M=6");
    CHECK_ERROR(mg_gemm_fp8_blockscaled(b, NULL, m, n, k, act, scales, MG_FP8_BLOCK_128X128, weight,
                                        scales + 64, MG_FP8_BLOCK_128X128, out, n),
                MG_ERR_UNSUPPORTED, "act 128x128 with weight 128x128");
    CHECK_ERROR(mg_gemm_bf16(NULL, NULL, 1, 1, 1, act, weight, out, MG_DTYPE_BF16, 1),
                MG_ERR_INVALID_ARGUMENT, "mg_gemm_bf16: NULL, invalid or closed backend");
    uint8_t poisoned[4 * 16 * 2];
    CHECK_OK(mg_copy_d2h(b, poisoned, out, sizeof poisoned));
    size_t touched = 0;
    for (size_t i = 0; i < sizeof poisoned; i++)
        touched += poisoned[i] != 0x5c;
    CHECK(touched == 0);

    /* a GEMM on odd-aligned bf16 operands runs (2-byte alignment is all BF16 needs) */
    uint16_t one = mg_f32_to_bf16(1.0f), two = mg_f32_to_bf16(2.0f);
    CHECK_OK(mg_copy_h2d(b, act + 2, &one, 2));
    CHECK_OK(mg_copy_h2d(b, weight + 6, &two, 2));
    CHECK_OK(mg_gemm_bf16(b, NULL, 1, 1, 1, act + 2, weight + 6, out + 4, MG_DTYPE_F32, 1));
    float result = 0;
    CHECK_OK(mg_copy_d2h(b, &result, out + 4, 4));
    CHECK(result == 2.0f);

    CHECK_OK(mg_gemm_set_batch_invariant(b, true));
    CHECK(mg_gemm_batch_invariant(b)); /* the CPU reference is batch-invariant always */
    CHECK_OK(mg_gemm_set_batch_invariant(b, false));
    CHECK(mg_gemm_batch_invariant(b));
    CHECK(!mg_gemm_batch_invariant(NULL));
    CHECK_ERROR(mg_gemm_set_batch_invariant(NULL, true), MG_ERR_INVALID_ARGUMENT,
                "mg_gemm_set_batch_invariant: NULL, invalid or closed backend");
    CHECK_OK(mg_free(b, act));
    CHECK_OK(mg_free(b, weight));
    CHECK_OK(mg_free(b, out));
    CHECK_OK(mg_free(b, scales));
}

static void test_scale_transpose(mg_backend *b) {
    mg_devptr buf = 0;
    CHECK_OK(mg_alloc(b, 1024, &buf));
    CHECK_ERROR(mg_fp8_act_scales_transpose(NULL, NULL, 4, 4, 128, buf, buf + 512),
                MG_ERR_INVALID_ARGUMENT, "NULL, invalid or closed backend");
    CHECK_ERROR(mg_fp8_act_scales_transpose(b, NULL, 0, 4, 128, buf, buf + 512),
                MG_ERR_INVALID_ARGUMENT, "empty shape M=0 K=128");
    CHECK_ERROR(mg_fp8_act_scales_transpose(b, NULL, 4, 4, 0, buf, buf + 512),
                MG_ERR_INVALID_ARGUMENT, "empty shape M=4 K=0");
    CHECK_ERROR(mg_fp8_act_scales_transpose(b, NULL, 5, 4, 128, buf, buf + 512),
                MG_ERR_INVALID_ARGUMENT, "m_pad=4 must be >= M=5");
    CHECK_ERROR(mg_fp8_act_scales_transpose(b, NULL, 5, 6, 128, buf, buf + 512),
                MG_ERR_INVALID_ARGUMENT, "a multiple of 4");
    CHECK_ERROR(mg_fp8_act_scales_transpose(b, NULL, 4, 4, 128, 0, buf + 512),
                MG_ERR_INVALID_ARGUMENT, "src is null");
    CHECK_ERROR(mg_fp8_act_scales_transpose(b, NULL, 4, 4, 128, buf, buf + 510),
                MG_ERR_INVALID_ARGUMENT, "dst 0x");
    /* 3 blocks x 8 rows: src 96 bytes, dst 96 bytes */
    CHECK_ERROR(mg_fp8_act_scales_transpose(b, NULL, 8, 8, 384, buf, buf + 64),
                MG_ERR_INVALID_ARGUMENT, "src and dst overlap");
    CHECK_ERROR(mg_fp8_act_scales_transpose(b, NULL, 8, 8, 384, buf + 64, buf),
                MG_ERR_INVALID_ARGUMENT, "src and dst overlap");
    CHECK_ERROR(mg_fp8_act_scales_transpose(b, NULL, 8, 8, 384, buf, buf + 960),
                MG_ERR_INVALID_ARGUMENT, "dst range");
    /* adjacent, not overlapping: runs */
    float src[24], dst[24];
    for (int i = 0; i < 24; i++)
        src[i] = (float)i;
    CHECK_OK(mg_copy_h2d(b, buf, src, sizeof src));
    CHECK_OK(mg_fp8_act_scales_transpose(b, NULL, 8, 8, 384, buf, buf + 96));
    CHECK_OK(mg_copy_d2h(b, dst, buf + 96, sizeof dst));
    size_t wrong = 0;
    for (int g = 0; g < 3; g++)
        for (int t = 0; t < 8; t++)
            wrong += dst[g * 8 + t] != src[t * 3 + g];
    CHECK(wrong == 0);
    CHECK_OK(mg_free(b, buf));
}

static void test_attention_arguments(mg_backend *b) {
    const mg_attention_desc desc = {
        .num_qo_heads = 2, .num_kv_heads = 1, .head_dim = 8, .window_left = -1, .sm_scale = 0.5f};
    int32_t qo[3] = {0, 2, 3}, kv[3] = {0, 3, 5};
    mg_attention_plan *p = (mg_attention_plan *)&desc;
    CHECK_ERROR(mg_attention_plan_create(b, &desc, qo, kv, 2, NULL, NULL), MG_ERR_INVALID_ARGUMENT,
                "NULL output pointer");
    CHECK_ERROR(mg_attention_plan_create(NULL, &desc, qo, kv, 2, NULL, &p), MG_ERR_INVALID_ARGUMENT,
                "invalid or closed backend");
    CHECK(p == NULL);
    mg_attention_desc d = desc;
    d.num_kv_heads = 0;
    CHECK_ERROR(mg_attention_plan_create(b, &d, qo, kv, 2, NULL, &p), MG_ERR_INVALID_ARGUMENT,
                "mg_attention_plan_create");
    d = desc, d.head_dim = 0;
    CHECK_ERROR(mg_attention_plan_create(b, &d, qo, kv, 2, NULL, &p), MG_ERR_INVALID_ARGUMENT,
                "head_dim");
    d = desc, d.graph_qo_rows = 0x80000000u, d.graph_kv_rows = 8;
    CHECK_ERROR(mg_attention_plan_create(b, &d, qo, kv, 2, NULL, &p), MG_ERR_INVALID_ARGUMENT,
                "capacities 2147483648 / 8 rows exceed INT32_MAX");
    d = desc, d.graph_qo_rows = 8, d.graph_kv_rows = 0x80000000u;
    CHECK_ERROR(mg_attention_plan_create(b, &d, qo, kv, 2, NULL, &p), MG_ERR_INVALID_ARGUMENT,
                "exceed INT32_MAX");
    d = desc, d.impl = (mg_attention_impl)5;
    CHECK_ERROR(mg_attention_plan_create(b, &d, qo, kv, 2, NULL, &p), MG_ERR_INVALID_ARGUMENT,
                "mg_attention_plan_create");
    CHECK_ERROR(mg_attention_plan_create(b, &desc, qo, kv, 0, NULL, &p), MG_ERR_INVALID_ARGUMENT,
                "batch");
    /* fixed grid: the kv indptrs must fit the capacity */
    d = desc, d.graph_qo_rows = 3, d.graph_kv_rows = 4;
    CHECK_ERROR(mg_attention_plan_create(b, &d, qo, kv, 2, NULL, &p), MG_ERR_INVALID_ARGUMENT,
                "mg_attention_plan_create");
    CHECK(p == NULL);

    CHECK_ERROR(mg_attention_plan_update(NULL, qo, kv, 2, NULL), MG_ERR_INVALID_ARGUMENT,
                "mg_attention_plan_update: NULL plan");
    mg_attention_tensors t = {0};
    CHECK_ERROR(mg_attention_run(NULL, &t, NULL), MG_ERR_INVALID_ARGUMENT, "NULL plan");
    mg_attention_plan_info info;
    CHECK_ERROR(mg_attention_plan_get_info(NULL, &info), MG_ERR_INVALID_ARGUMENT, "NULL plan");
    CHECK_OK(mg_attention_plan_destroy(NULL));
    CHECK(mg_attention_plan_flops(NULL) == 0.0);

    /* a fixed-grid plan: its run takes exactly its capacities */
    d = desc, d.graph_qo_rows = 4, d.graph_kv_rows = 6;
    CHECK_OK(mg_attention_plan_create(b, &d, qo, kv, 2, NULL, &p));
    CHECK_ERROR(mg_attention_plan_get_info(p, NULL), MG_ERR_INVALID_ARGUMENT, "NULL output");
    CHECK_OK(mg_attention_plan_get_info(p, &info));
    CHECK(info.batch_size == 2 && info.qo_total == 3 && info.kv_total == 5);
    /* flops: 4 * D * Hq * pairs, 2*3 + 1*2 pairs */
    CHECK(mg_attention_plan_flops(p) == 4.0 * 8 * 2 * 8);
    mg_devptr q = 0, kk = 0, v = 0, o = 0, lse = 0;
    CHECK_OK(mg_alloc(b, 4 * 2 * 8 * 2, &q));
    CHECK_OK(mg_alloc(b, 4 * 2 * 8 * 2, &o));
    CHECK_OK(mg_alloc(b, 6 * 8 * 2, &kk));
    CHECK_OK(mg_alloc(b, 6 * 8 * 2, &v));
    CHECK_OK(mg_alloc(b, 4 * 2 * 4, &lse));
    t = (mg_attention_tensors){q, kk, v, o, lse, 3, 5};
    CHECK_ERROR(mg_attention_run(p, &t, NULL), MG_ERR_INVALID_ARGUMENT,
                "a fixed-grid plan runs on its capacities: qo_rows 3 / kv_rows 5 given, 4 / 6");
    t.qo_rows = 4;
    CHECK_ERROR(mg_attention_run(p, &t, NULL), MG_ERR_INVALID_ARGUMENT, "kv_rows 5 given");
    t.kv_rows = 6;
    t.lse = lse + 2;
    CHECK_ERROR(mg_attention_run(p, &t, NULL), MG_ERR_INVALID_ARGUMENT, "lse 0x");
    t.lse = lse + 4;
    CHECK_ERROR(mg_attention_run(p, &t, NULL), MG_ERR_INVALID_ARGUMENT, "lse range");
    t.lse = lse;
    t.k = q; /* the k range is checked against k/v rows: q's buffer is large enough */
    t.v = kk + 16;
    CHECK_ERROR(mg_attention_run(p, &t, NULL), MG_ERR_INVALID_ARGUMENT, "v range");
    t.k = kk, t.v = v;
    CHECK_OK(mg_attention_run(p, &t, NULL));
    CHECK_OK(mg_attention_plan_destroy(p));

    /* an eager plan runs on its indptrs' totals, with or without lse */
    CHECK_OK(mg_attention_plan_create(b, &desc, qo, kv, 2, NULL, &p));
    mg_attention_tensors without_lse = {q, kk, v, o, 0, 3, 5};
    CHECK_OK(mg_attention_run(p, &without_lse, NULL));
    CHECK_OK(mg_attention_plan_destroy(p));
    /* rows far beyond the buffers are refused before anything runs */
    mg_attention_desc wide = {.num_qo_heads = 1024,
                              .num_kv_heads = 1024,
                              .head_dim = 512,
                              .window_left = -1,
                              .sm_scale = 1.0f};
    int32_t big_qo[2] = {0, 0x7fffffff}, big_kv[2] = {0, 1};
    mg_status st = mg_attention_plan_create(b, &wide, big_qo, big_kv, 1, NULL, &p);
    if (st == MG_OK) {
        mg_attention_tensors over = {q, kk, v, o, 0, 0x7fffffff, 1};
        CHECK_ERROR(mg_attention_run(p, &over, NULL), MG_ERR_INVALID_ARGUMENT, "q range");
        CHECK_OK(mg_attention_plan_destroy(p));
    } else {
        CHECK_STATUS(st, MG_ERR_INVALID_ARGUMENT);
    }
    const mg_devptr all[] = {q, kk, v, o, lse};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        CHECK_OK(mg_free(b, all[i]));
}

/* An output sharing bytes with an input is refused by GEMM and attention as by every other op
 * (op_builtin.h's rule): the refused call writes nothing. */
static void test_output_overlap(mg_backend *b) {
    const uint32_t m = 4, n = 16, k = 16;
    mg_devptr buf = 0;
    CHECK_OK(mg_alloc(b, 4096, &buf));
    CHECK_OK(mg_memset(b, buf, 0x5c, 4096));
    const mg_devptr act = buf, weight = buf + 512, scales = buf + 2048;
    /* out starting inside act, then inside weight, then on the scales */
    CHECK_ERROR(mg_gemm_bf16(b, NULL, m, n, k, act, weight, act + 64, MG_DTYPE_BF16, n),
                MG_ERR_INVALID_ARGUMENT, "mg_gemm_bf16: act and out overlap");
    CHECK_ERROR(mg_gemm_bf16(b, NULL, m, n, k, act, weight, weight + 256, MG_DTYPE_F32, n),
                MG_ERR_INVALID_ARGUMENT, "weight and out overlap");
    CHECK_ERROR(mg_gemm_fp8_rowwise(b, NULL, m, n, k, act, scales, weight, scales + 64, scales, n),
                MG_ERR_INVALID_ARGUMENT, "out and act_scale overlap");
    /* a caller's workspace is written too */
    mg_gemm_plan plan = {
        .kind = MG_GEMM_BF16, .m = m, .n = n, .k = k, .ldc = n, .out_type = MG_DTYPE_BF16};
    mg_gemm_tensors gt = {
        .act = act, .weight = weight, .out = buf + 1024, .workspace = act, .workspace_bytes = 256};
    CHECK_ERROR(mg_gemm(b, NULL, &plan, &gt), MG_ERR_INVALID_ARGUMENT, "act and workspace overlap");
    CHECK_OK(mg_stream_synchronize(mg_stream_default(b)));
    uint8_t bytes[4096];
    CHECK_OK(mg_copy_d2h(b, bytes, buf, sizeof bytes));
    size_t touched = 0;
    for (size_t i = 0; i < sizeof bytes; i++)
        touched += bytes[i] != 0x5c;
    CHECK(touched == 0);

    /* attention: o inside q, lse inside k; both refused before the plan runs */
    const mg_attention_desc desc = {
        .num_qo_heads = 2, .num_kv_heads = 1, .head_dim = 8, .window_left = -1, .sm_scale = 0.5f};
    int32_t qo[3] = {0, 2, 3}, kv[3] = {0, 3, 5};
    mg_attention_plan *p = NULL;
    CHECK_OK(mg_attention_plan_create(b, &desc, qo, kv, 2, NULL, &p));
    const mg_devptr q = buf, kk = buf + 256, v = buf + 512, o = buf + 1024, lse = buf + 1536;
    mg_attention_tensors t = {q, kk, v, q + 32, lse, 3, 5};
    CHECK_ERROR(mg_attention_run(p, &t, NULL), MG_ERR_INVALID_ARGUMENT,
                "mg_attention_run: q and o overlap");
    t = (mg_attention_tensors){q, kk, v, o, kk + 16, 3, 5};
    CHECK_ERROR(mg_attention_run(p, &t, NULL), MG_ERR_INVALID_ARGUMENT, "k and lse overlap");
    t = (mg_attention_tensors){q, kk, v, o, lse, 3, 5};
    CHECK_OK(mg_attention_run(p, &t, NULL));
    CHECK_OK(mg_attention_plan_destroy(p));
    CHECK_OK(mg_free(b, buf));
}

/* mg_gemm_kind_describe: one entry per kind, in order, with distinct names, the entry point's
 * name, the input type that the kind's operands have, and the op whose providers run it;
 * nothing for a value that is no kind, and an unknown kind refused by mg_gemm. */
static void test_gemm_kinds(mg_backend *b) {
    static const char *const functions[MG_GEMM_KIND_COUNT] = {
        "mg_gemm_bf16", "mg_gemm_fp8_tensorwise", "mg_gemm_fp8_rowwise", "mg_gemm_fp8_blockscaled"};
    for (int k = 0; k < MG_GEMM_KIND_COUNT; k++) {
        const mg_gemm_kind_info *info = mg_gemm_kind_describe((mg_gemm_kind)k);
        CHECK(info != NULL);
        if (!info)
            continue;
        CHECK((int)info->kind == k && !strcmp(info->function, functions[k]));
        CHECK(info->input_type == (k == MG_GEMM_BF16 ? MG_DTYPE_BF16 : MG_DTYPE_FP8_E4M3));
        CHECK(info->op == (k == MG_GEMM_BF16 ? MG_OP_GEMM_BF16 : MG_OP_GEMM_FP8));
        for (int j = 0; j < k; j++)
            CHECK(strcmp(info->name, mg_gemm_kind_describe((mg_gemm_kind)j)->name) != 0);
    }
    CHECK(mg_gemm_kind_describe((mg_gemm_kind)MG_GEMM_KIND_COUNT) == NULL);
    CHECK(mg_gemm_kind_describe((mg_gemm_kind)-1) == NULL);
    mg_gemm_plan plan = {.kind = (mg_gemm_kind)MG_GEMM_KIND_COUNT,
                         .m = 1,
                         .n = 16,
                         .k = 16,
                         .ldc = 16,
                         .out_type = MG_DTYPE_BF16};
    mg_gemm_tensors t = {0};
    CHECK_ERROR(mg_gemm(b, NULL, &plan, &t), MG_ERR_INVALID_ARGUMENT, "unknown GEMM kind");
}

int main(void) {
    mg_backend *b = NULL;
    CHECK_OK(mg_backend_open(MG_BACKEND_CPU, 2, &b));
    if (!b)
        return test_finish();
    test_prewarm_plans(b);
    test_gemm_operands(b);
    test_scale_transpose(b);
    test_attention_arguments(b);
    test_output_overlap(b);
    test_gemm_kinds(b);
    CHECK_OK(mg_backend_close(b));
    return test_finish();
}
