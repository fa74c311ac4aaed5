/*
 * test_forward_mlx.c - the forward pass of src/model with MLX weights (model.h, model_mlx.h) on
 * the CPU backend: the preset micro with the committed checkpoints (tests/mlx/checkpoints/,
 * 8-bit and 4-bit) run through the MLX ops (GEMM at prefill, GEMVs at decode) against the same
 * model whose layer matrices are the checkpoint's, dequantized to BF16 at load and run by the
 * BF16 path. The final hidden states after the prefill must agree within 2% (relative to each
 * request's largest value), and so must those of every decode step while the greedy tokens
 * agree; the same run against the other bits' dequantized weights must be further off (the
 * comparison sees the weights). The preset tiny, which has no checkpoint, quantizes its own
 * weights at load (mg_mlx_quantize) and must agree with its dequantized weights the same way;
 * micro quantized at load must equal micro from the committed checkpoints bit for bit in every
 * pass (MLX made those from the same weights with mx.quantize). Then a checkpoint that is
 * missing, of other bits or of another shape must be refused with a one-line message. Every
 * checkpoint it opens is found through METRALE_MLX_CHECKPOINTS when that is set
 * (test_forward_mlx_moved: this file built with a compiled-in folder that does not exist, run with
 * the variable naming a copy).
 */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "metrale/dtype.h"
#include "model.h"
#include "test_util.h"

/* The committed checkpoints' folder: METRALE_MLX_CHECKPOINTS in the environment (a binary run
 * off its source tree, as on the GPU machine, finds them there), else the source tree's that
 * the build passes; the same order as the model's own lookup of a preset's checkpoint. */
static const char *checkpoints_dir(void) {
    const char *env = getenv("METRALE_MLX_CHECKPOINTS");
    return env && *env ? env : METRALE_MLX_CHECKPOINTS;
}

#define STEPS 4u

typedef struct run {
    mg_fwd *m;
    uint16_t hidden[STEPS + 1][64 * 128];
    int32_t tokens[64][STEPS + 1];
} run;

/* A run of `preset` with MLX weights w: from checkpoint (NULL: the preset's own lookup, the
 * committed checkpoint or the weights quantized at load), or dequantized to BF16 at load. */
static bool start(mg_backend *b, const char *preset, mg_fwd_weights w, const char *checkpoint,
                  bool dequantized, run *r) {
    mg_fwd_config c = mg_fwd_config_default(mg_fwd_preset_find(preset));
    c.checkpoint = checkpoint;
    c.steps = STEPS;
    c.use_graphs = false;
    c.weights = w;
    c.mlx_dequantized = dequantized;
    mg_status st = mg_fwd_create(b, &c, &r->m);
    if (st)
        fprintf(stderr, "FAIL create: %s\n", mg_last_error());
    CHECK_OK(st);
    if (st)
        return false;
    mg_stream *s = mg_stream_default(b);
    CHECK_OK(mg_fwd_prefill(r->m, s));
    CHECK_OK(mg_fwd_final_hidden(r->m, r->hidden[0]));
    for (uint32_t i = 1; i <= STEPS; i++) {
        CHECK_OK(mg_fwd_decode(r->m, s));
        CHECK_OK(mg_fwd_final_hidden(r->m, r->hidden[i]));
    }
    for (uint32_t q = 0; q < c.batch; q++) {
        uint32_t n;
        const int32_t *t = mg_fwd_tokens(r->m, q, &n);
        CHECK(n == STEPS + 1);
        memcpy(r->tokens[q], t, sizeof r->tokens[q]);
    }
    return true;
}

/* The largest error of pass `i` over the requests, relative to each request's largest value. */
static double pass_error(const run *a, const run *b, uint32_t i, uint32_t batch, uint32_t hidden) {
    double worst = 0;
    for (uint32_t q = 0; q < batch; q++) {
        double diff = 0, scale = 0;
        for (uint32_t j = 0; j < hidden; j++) {
            double x = mg_bf16_to_f32(a->hidden[i][q * hidden + j]);
            double y = mg_bf16_to_f32(b->hidden[i][q * hidden + j]);
            diff = fmax(diff, fabs(x - y));
            scale = fmax(scale, fabs(y));
        }
        double e = scale > 0 ? diff / scale : diff;
        worst = e > worst || isnan(e) ? e : worst;
    }
    return worst;
}

static void expect_refused(mg_backend *b, const char *preset, mg_fwd_weights w,
                           const char *checkpoint, const char *needle) {
    mg_fwd_config c = mg_fwd_config_default(mg_fwd_preset_find(preset));
    c.weights = w;
    c.checkpoint = checkpoint;
    c.use_graphs = false;
    mg_fwd *m = NULL;
    mg_status st = mg_fwd_create(b, &c, &m);
    const char *e = mg_last_error();
    CHECK(st != MG_OK && m == NULL);
    CHECK(strstr(e, needle) != NULL && strchr(e, '\n') == NULL);
    if (st == MG_OK || !strstr(e, needle))
        fprintf(stderr, "FAIL %s %s %s: status %d, message '%s' (wanted '%s')\n", preset,
                mg_fwd_weights_name(w), checkpoint ? checkpoint : "(default)", (int)st, e, needle);
    mg_fwd_destroy(m);
}

/* The MLX runs of `preset` (8 and 4 bits, c.checkpoint NULL) against the same weights
 * dequantized: within 2% while the tokens agree, nearer than the other bits' weights. */
static void against_dequantized(mg_backend *b, const char *preset) {
    const mg_fwd_preset *p = mg_fwd_preset_find(preset);
    uint32_t batch = p->batch, H = p->shape.hidden;
    static run quant[2], deq[2];
    const mg_fwd_weights kinds[2] = {MG_FWD_WEIGHTS_MLX8, MG_FWD_WEIGHTS_MLX4};
    bool ok = true;
    for (int i = 0; i < 2; i++)
        ok = ok && start(b, preset, kinds[i], NULL, false, &quant[i]) &&
             start(b, preset, kinds[i], NULL, true, &deq[i]);
    for (int i = 0; ok && i < 2; i++) {
        const char *name = mg_fwd_weights_name(kinds[i]);
        for (uint32_t s = 0; s <= STEPS; s++) {
            bool same = true; /* the tokens fed so far agree */
            for (uint32_t q = 0; q < batch; q++)
                for (uint32_t t = 0; t < s; t++)
                    same = same && quant[i].tokens[q][t] == deq[i].tokens[q][t];
            if (!same)
                break;
            double e = pass_error(&quant[i], &deq[i], s, batch, H);
            printf("%s %s pass %u: max rel err %.4g against the dequantized weights\n", preset,
                   name, s, e);
            CHECK(e <= 0.02);
        }
        double own = pass_error(&quant[i], &deq[i], 0, batch, H);
        double other = pass_error(&quant[i], &deq[1 - i], 0, batch, H);
        printf("%s %s prefill: %.4g against its own dequantized weights, %.4g against the other "
               "bits'\n",
               preset, name, own, other);
        CHECK(other > own);
    }
    for (int i = 0; i < 2; i++) {
        mg_fwd_destroy(quant[i].m);
        mg_fwd_destroy(deq[i].m);
        quant[i].m = deq[i].m = NULL;
    }
}

/* micro quantized at load (the checkpoint lookup pointed at a folder that does not exist)
 * against micro from the committed checkpoint: every pass's hidden states and tokens equal. */
static void at_load_equals_checkpoint(mg_backend *b) {
    const mg_fwd_preset *p = mg_fwd_preset_find("micro");
    const size_t hidden_bytes = (size_t)p->batch * p->shape.hidden * 2;
    static run loaded, quantized;
    const mg_fwd_weights kinds[2] = {MG_FWD_WEIGHTS_MLX8, MG_FWD_WEIGHTS_MLX4};
    char dir[1100], saved[1024];
    snprintf(saved, sizeof saved, "%s", checkpoints_dir());
    for (int i = 0; i < 2; i++) {
        snprintf(dir, sizeof dir, "%s/micro-mlx%d", saved, i ? 4 : 8);
        bool ok = start(b, "micro", kinds[i], dir, false, &loaded);
        setenv("METRALE_MLX_CHECKPOINTS", "/nonexistent/metrale-checkpoints", 1);
        ok = start(b, "micro", kinds[i], NULL, false, &quantized) && ok;
        setenv("METRALE_MLX_CHECKPOINTS", saved, 1);
        for (uint32_t s = 0; ok && s <= STEPS; s++) {
            bool same = !memcmp(loaded.hidden[s], quantized.hidden[s], hidden_bytes);
            CHECK(same);
            if (!same)
                fprintf(stderr,
                        "FAIL micro %s pass %u: quantized at load differs from the "
                        "checkpoint\n",
                        mg_fwd_weights_name(kinds[i]), s);
        }
        CHECK(!ok || !memcmp(loaded.tokens, quantized.tokens, sizeof loaded.tokens));
        printf("micro %s quantized at load: %s the committed checkpoint\n",
               mg_fwd_weights_name(kinds[i]), ok ? "compared with" : "could not run beside");
        mg_fwd_destroy(loaded.m);
        mg_fwd_destroy(quantized.m);
        loaded.m = quantized.m = NULL;
    }
}

int main(void) {
    mg_backend *b = NULL;
    CHECK_OK(mg_backend_open(MG_BACKEND_CPU, 0, &b));
    if (!b)
        return test_finish();
    against_dequantized(b, "micro");
    against_dequantized(b, "tiny");
    at_load_equals_checkpoint(b);
    expect_refused(b, "micro", MG_FWD_WEIGHTS_MLX8, "/nonexistent/checkpoint", "MLX checkpoint");
    /* the committed 8-bit checkpoint */
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/micro-mlx8", checkpoints_dir());
    expect_refused(b, "micro", MG_FWD_WEIGHTS_MLX4, dir, "the preset needs [256, 128] 4-bit");
    expect_refused(b, "tiny", MG_FWD_WEIGHTS_MLX8, dir, "the preset needs");
    expect_refused(b, "tiny-moe", MG_FWD_WEIGHTS_MLX8, NULL, "mixture of experts");
    mg_backend_close(b);
    return test_finish();
}
