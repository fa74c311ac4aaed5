/* test_mlx_reference.c - the MLX ops (metrale/mlx.h) and the readers (metrale/safetensors.h)
 * against MLX itself: tests/mlx/make_reference.py quantizes random weights with mx.quantize,
 * writes them with mx.save_safetensors (one file and two shards) and records mx.dequantize and
 * mx.quantized_matmul results. Here every layer is loaded with our readers and run on the CPU
 * backend and, when present, on CUDA: dequant must equal MLX's bit for bit; the GEMV (M=5),
 * silu_gate GEMV and GEMM (M=37) must agree within BF16 bounds. mg_mlx_quantize of each layer's
 * source weights, and of rows chosen for mx.quantize's edge cases, must give MLX's packed words,
 * scales and biases bit for bit (into poisoned buffers), and bad arguments must be refused with
 * nothing written.
 *
 * The files come from the ctest fixture mlx_reference (tests/mlx/setup.sh), in the folder
 * METRALE_MLX_REFERENCE names; without it, or when MLX could not be installed, exit 77. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "metrale/dtype.h"
#include "metrale/mlx.h"
#include "metrale/safetensors.h"
#include "test_util.h"

#define M_GEMV 5u

typedef struct layer_case {
    char name[160];
    unsigned experts, n, k, bits, group;
    char dtype[16];
} layer_case;

/* Aligned copies of the reference tensors read here: safetensors packs tensors back to back,
 * so a BF16 tensor's data in the mapping may start at an odd address. Freed at exit. */
static void *tensor_copies[512];
static size_t tensor_copy_count;

/* Points t->data at an aligned copy of its bytes. */
static bool aligned(mg_st_tensor *t) {
    void *copy = tensor_copy_count < sizeof tensor_copies / sizeof *tensor_copies
                     ? malloc(t->bytes ? t->bytes : 1)
                     : NULL;
    if (!copy) {
        fprintf(stderr, "FAIL: no room to copy tensor %s\n", t->name);
        test_failures++;
        return false;
    }
    memcpy(copy, t->data, t->bytes);
    tensor_copies[tensor_copy_count++] = copy;
    t->data = copy;
    return true;
}

static const mg_st_tensor *ref_tensor(const mg_st_model *ref, const char *layer, const char *suffix,
                                      mg_st_tensor *t) {
    char name[256];
    snprintf(name, sizeof name, "%s.%s", layer, suffix);
    if (mg_st_find(ref, name, t) != MG_OK || t->dtype != MG_ST_BF16) {
        fprintf(stderr, "FAIL: reference tensor %s missing or not BF16\n", name);
        test_failures++;
        return NULL;
    }
    return aligned(t) ? t : NULL;
}

static mg_devptr upload(mg_backend *b, const void *data, size_t bytes) {
    mg_devptr p = 0;
    CHECK_OK(mg_alloc(b, bytes, &p));
    if (p)
        CHECK_OK(mg_copy_h2d(b, p, data, bytes));
    return p;
}

static mg_devptr poisoned(mg_backend *b, size_t bytes) {
    mg_devptr p = 0;
    CHECK_OK(mg_alloc(b, bytes, &p));
    if (p)
        CHECK_OK(mg_memset(b, p, 0xff, bytes));
    return p;
}

/* y (rows x n, BF16 on the device) against MLX's y_ref, within 2^-7 |y| (both outputs' BF16
 * roundings) + 2^-spread_shift sum |w a| (summation order; for silu_gate also the activations'
 * BF16 rounding, which MLX does in its own way; for the GEMM the weights' BF16 rounding by the
 * dequant it multiplies, each within 2^-9). */
static void compare_product(mg_backend *b, const char *what, int spread_shift, const char *layer,
                            mg_devptr y, const uint16_t *y_ref, const uint16_t *act,
                            const uint16_t *deq, unsigned rows, unsigned n, unsigned k) {
    uint16_t *got = malloc((size_t)rows * n * 2);
    CHECK_OK(mg_copy_d2h(b, got, y, (size_t)rows * n * 2));
    int bad = 0;
    for (unsigned t = 0; t < rows; t++)
        for (unsigned r = 0; r < n; r++) {
            double magnitude = 0;
            for (unsigned j = 0; j < k; j++)
                magnitude += fabs((double)mg_bf16_to_f32(deq[(size_t)r * k + j]) *
                                  mg_bf16_to_f32(act[(size_t)t * k + j]));
            double want = mg_bf16_to_f32(y_ref[(size_t)t * n + r]);
            double have = mg_bf16_to_f32(got[(size_t)t * n + r]);
            double tol = ldexp(fabs(want), -7) + ldexp(magnitude, -spread_shift);
            if (!(fabs(have - want) <= tol) && bad++ < 3)
                fprintf(stderr, "FAIL %s %s [%u, %u]: %g, MLX %g (tolerance %g)\n", what, layer, t,
                        r, have, want, tol);
        }
    test_checks++;
    test_failures += bad != 0;
    free(got);
}

/* silu(g) * u as the op defines it (FP32, rounded once to BF16): the activations the silu_gate
 * GEMV multiplies, for the tolerance. */
static uint16_t *silu_gate_activations(const uint16_t *g, const uint16_t *u, size_t count) {
    uint16_t *h = malloc(count * 2);
    for (size_t i = 0; i < count; i++) {
        float gf = mg_bf16_to_f32(g[i]);
        h[i] = mg_f32_to_bf16(gf / (1.0f + expf(-gf)) * mg_bf16_to_f32(u[i]));
    }
    return h;
}

/* y_have (rows x n, device) must be bf16(y_plain + bias) bit for bit: the rounding metrale/mlx.h
 * defines for a layer's bias, computed here from the op's result without the bias. */
static void compare_bias_rounding(mg_backend *b, const char *what, const char *layer,
                                  mg_devptr y_have, mg_devptr y_plain, const uint16_t *bias,
                                  unsigned rows, unsigned n) {
    size_t count = (size_t)rows * n;
    uint16_t *have = malloc(count * 2), *plain = malloc(count * 2);
    CHECK_OK(mg_copy_d2h(b, have, y_have, count * 2));
    CHECK_OK(mg_copy_d2h(b, plain, y_plain, count * 2));
    size_t bad = 0;
    for (size_t i = 0; i < count; i++) {
        uint16_t want = mg_f32_to_bf16(mg_bf16_to_f32(plain[i]) + mg_bf16_to_f32(bias[i % n]));
        if (have[i] != want && bad++ < 3)
            fprintf(stderr, "FAIL %s %s bias [%zu]: 0x%04x, want 0x%04x\n", what, layer, i, have[i],
                    want);
    }
    test_checks++;
    test_failures += bad != 0;
    free(have);
    free(plain);
}

/* The layer made by nn.QuantizedLinear(bias=True): its loaded BF16 bias, the GEMV and the GEMM
 * with the bias against MLX's outputs, and against their own unbiased results plus the bias. */
static void run_bias(mg_backend *b, const mg_st_model *model, const mg_st_model *ref,
                     const layer_case *c, const mg_mlx_linear *w, const mg_st_tensor *x,
                     const mg_st_tensor *xg, const uint16_t *deq0) {
    char name[256];
    mg_st_tensor yb, ygb, bias;
    snprintf(name, sizeof name, "%s.y_bias", c->name);
    bool biased = mg_st_find(ref, name, &yb) == MG_OK;
    CHECK(biased == (w->bias != 0));
    if (!biased || !aligned(&yb))
        return;
    snprintf(name, sizeof name, "%s.bias", c->name);
    bool found = mg_st_find(model, name, &bias) == MG_OK;
    CHECK(found);
    if (!found || !aligned(&bias))
        return;
    if (!ref_tensor(ref, c->name, "y_gemm_bias", &ygb) || w->bias_type != MG_DTYPE_BF16 ||
        bias.dtype != MG_ST_BF16) {
        CHECK(!"biased layer: reference or bias type");
        return;
    }
    mg_mlx_linear plain = *w;
    plain.bias = 0;
    unsigned rows_gemm = (unsigned)xg->shape[0];
    mg_devptr dx = upload(b, x->data, x->bytes), dxg = upload(b, xg->data, xg->bytes);
    mg_devptr dy = poisoned(b, (size_t)M_GEMV * c->n * 2),
              dy0 = poisoned(b, (size_t)M_GEMV * c->n * 2);
    CHECK_OK(mg_mlx_gemv(b, NULL, w, 0, M_GEMV, dx, dy));
    CHECK_OK(mg_mlx_gemv(b, NULL, &plain, 0, M_GEMV, dx, dy0));
    compare_product(b, "gemv+bias", 12, c->name, dy, yb.data, x->data, deq0, M_GEMV, c->n, c->k);
    compare_bias_rounding(b, "gemv", c->name, dy, dy0, bias.data, M_GEMV, c->n);
    mg_devptr dyg = poisoned(b, (size_t)rows_gemm * c->n * 2);
    mg_devptr dyg0 = poisoned(b, (size_t)rows_gemm * c->n * 2);
    mg_devptr scratch = poisoned(b, mg_mlx_gemm_scratch_bytes(w));
    CHECK_OK(mg_mlx_gemm(b, NULL, w, 0, rows_gemm, dxg, dyg, scratch));
    CHECK_OK(mg_mlx_gemm(b, NULL, &plain, 0, rows_gemm, dxg, dyg0, scratch));
    compare_product(b, "gemm+bias", 8, c->name, dyg, ygb.data, xg->data, deq0, rows_gemm, c->n,
                    c->k);
    compare_bias_rounding(b, "gemm", c->name, dyg, dyg0, bias.data, rows_gemm, c->n);
    /* gate_up adds each layer's own bias: the biased layer as gate, the plain one as up,
     * against both plain */
    size_t out_bytes = (size_t)M_GEMV * c->n * 2;
    CHECK_OK(mg_memset(b, dy, 0xff, out_bytes));
    CHECK_OK(mg_memset(b, dy0, 0xff, out_bytes));
    mg_devptr dup = poisoned(b, out_bytes), dup0 = poisoned(b, out_bytes);
    CHECK_OK(mg_mlx_gemv_gate_up(b, NULL, w, &plain, 0, M_GEMV, dx, dy, dup));
    CHECK_OK(mg_mlx_gemv_gate_up(b, NULL, &plain, &plain, 0, M_GEMV, dx, dy0, dup0));
    compare_bias_rounding(b, "gate_up gate", c->name, dy, dy0, bias.data, M_GEMV, c->n);
    uint16_t *zero = malloc((size_t)c->n * 2); /* -0: x + -0 is x, -0 included */
    for (unsigned i = 0; i < c->n; i++)
        zero[i] = 0x8000;
    compare_bias_rounding(b, "gate_up up", c->name, dup, dup0, zero, M_GEMV, c->n);
    free(zero);
    mg_devptr bufs[] = {dx, dxg, dy, dy0, dyg, dyg0, scratch, dup, dup0};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
        mg_free(b, bufs[i]);
}

static void run_layer(mg_backend *b, const mg_st_model *model, const mg_mlx_config *config,
                      const mg_st_model *ref, const layer_case *c) {
    mg_mlx_linear w;
    mg_status st = mg_mlx_linear_load(b, model, config, c->name, &w);
    CHECK_OK(st);
    if (st)
        return;
    CHECK(w.experts == c->experts && w.n == c->n && w.k == c->k && w.bits == c->bits &&
          w.group_size == c->group);
    CHECK(w.scale_type == (strcmp(c->dtype, "float16") ? MG_DTYPE_BF16 : MG_DTYPE_F16));
    mg_st_tensor deq, x, y, xg, yg, g, u, ys;
    if (!ref_tensor(ref, c->name, "dequant", &deq) || !ref_tensor(ref, c->name, "x", &x) ||
        !ref_tensor(ref, c->name, "y", &y) || !ref_tensor(ref, c->name, "x_gemm", &xg) ||
        !ref_tensor(ref, c->name, "y_gemm", &yg) || !ref_tensor(ref, c->name, "g", &g) ||
        !ref_tensor(ref, c->name, "u", &u) || !ref_tensor(ref, c->name, "y_silu", &ys)) {
        mg_mlx_linear_free(b, &w);
        return;
    }
    size_t layer_elems = (size_t)c->n * c->k;
    /* Dequant of every expert, bit for bit. */
    mg_devptr out = poisoned(b, layer_elems * 2);
    uint16_t *host = malloc(layer_elems * 2);
    for (unsigned e = 0; e < c->experts; e++) {
        CHECK_OK(mg_mlx_dequant(b, NULL, &w, e, out));
        CHECK_OK(mg_copy_d2h(b, host, out, layer_elems * 2));
        const uint16_t *want = (const uint16_t *)deq.data + e * layer_elems;
        size_t mismatches = 0, first = 0;
        for (size_t i = 0; i < layer_elems; i++)
            if (host[i] != want[i] && !mismatches++)
                first = i;
        CHECK(mismatches == 0);
        if (mismatches)
            fprintf(stderr,
                    "  dequant %s expert %u: %zu of %zu differ, first [%zu]: 0x%04x, MLX "
                    "0x%04x\n",
                    c->name, e, mismatches, layer_elems, first, host[first], want[first]);
    }
    const uint16_t *deq0 = deq.data; /* MLX's products are of expert 0 */
    unsigned rows_gemm = (unsigned)xg.shape[0];
    mg_devptr dx = upload(b, x.data, x.bytes), dg = upload(b, g.data, g.bytes),
              du = upload(b, u.data, u.bytes), dxg = upload(b, xg.data, xg.bytes);
    mg_devptr dy = poisoned(b, (size_t)M_GEMV * c->n * 2);
    /* MLX's y, y_silu and y_gemm are without the layer's own bias (run_bias adds it) */
    mg_mlx_linear unbiased = w;
    unbiased.bias = 0;
    CHECK_OK(mg_mlx_gemv(b, NULL, &unbiased, 0, M_GEMV, dx, dy));
    compare_product(b, "gemv", 12, c->name, dy, y.data, x.data, deq0, M_GEMV, c->n, c->k);
    CHECK_OK(mg_memset(b, dy, 0xff, (size_t)M_GEMV * c->n * 2));
    CHECK_OK(mg_mlx_gemv_silu_gate(b, NULL, &unbiased, 0, M_GEMV, dg, du, dy));
    uint16_t *h = silu_gate_activations(g.data, u.data, (size_t)M_GEMV * c->k);
    compare_product(b, "silu_gate", 8, c->name, dy, ys.data, h, deq0, M_GEMV, c->n, c->k);
    free(h);
    mg_devptr dyg = poisoned(b, (size_t)rows_gemm * c->n * 2);
    mg_devptr scratch = poisoned(b, mg_mlx_gemm_scratch_bytes(&w));
    CHECK_OK(mg_mlx_gemm(b, NULL, &unbiased, 0, rows_gemm, dxg, dyg, scratch));
    compare_product(b, "gemm", 8, c->name, dyg, yg.data, xg.data, deq0, rows_gemm, c->n, c->k);
    run_bias(b, model, ref, c, &w, &x, &xg, deq0);
    mg_devptr bufs[] = {out, dx, dg, du, dxg, dy, dyg, scratch};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
        mg_free(b, bufs[i]);
    free(host);
    mg_mlx_linear_free(b, &w);
}

/* The bytes of `t` against `want` (same size), counting and naming the first difference. */
static void compare_bytes(const char *what, const char *name, const void *got, const void *want,
                          size_t bytes, size_t element) {
    size_t mismatches = 0, first = 0;
    for (size_t i = 0; i < bytes; i += element)
        if (memcmp((const char *)got + i, (const char *)want + i, element) && !mismatches++)
            first = i / element;
    CHECK(mismatches == 0);
    if (mismatches)
        fprintf(stderr, "  quantize %s %s: %zu of %zu elements differ, first [%zu]\n", name, what,
                mismatches, bytes / element, first);
}

/* mg_mlx_quantize of `source` ([rows, k] BF16 or F16) against MLX's weight, scales and biases,
 * into buffers poisoned first. */
static void check_quantize(const char *name, const mg_st_tensor *source, const mg_st_tensor *weight,
                           const mg_st_tensor *scales, const mg_st_tensor *biases, unsigned rows,
                           unsigned k, unsigned bits, unsigned group) {
    mg_dtype type = source->dtype == MG_ST_F16 ? MG_DTYPE_F16 : MG_DTYPE_BF16;
    size_t words = (size_t)rows * k * bits / 32, groups = (size_t)rows * (k / group);
    CHECK(source->bytes == (size_t)rows * k * 2 && weight->bytes == words * 4 &&
          scales->bytes == groups * 2 && biases->bytes == groups * 2);
    if (source->bytes != (size_t)rows * k * 2 || weight->bytes != words * 4 ||
        scales->bytes != groups * 2 || biases->bytes != groups * 2)
        return;
    uint32_t *w = malloc(words * 4);
    uint16_t *s = malloc(groups * 2), *b = malloc(groups * 2);
    if (!w || !s || !b) {
        CHECK(!"out of memory");
        free(w), free(s), free(b);
        return;
    }
    memset(w, 0xa5, words * 4);
    memset(s, 0xa5, groups * 2);
    memset(b, 0xa5, groups * 2);
    CHECK_OK(mg_mlx_quantize(source->data, type, rows, k, k, bits, group, w, s, b));
    compare_bytes("weight", name, w, weight->data, words * 4, 4);
    compare_bytes("scales", name, s, scales->data, groups * 2, 2);
    compare_bytes("biases", name, b, biases->data, groups * 2, 2);
    free(w), free(s), free(b);
}

static bool find_aligned(const mg_st_model *m, const char *name, const char *suffix,
                         mg_st_tensor *t) {
    char full[256];
    snprintf(full, sizeof full, "%s.%s", name, suffix);
    if (mg_st_find(m, full, t) != MG_OK) {
        fprintf(stderr, "FAIL: tensor %s missing\n", full);
        test_failures++;
        return false;
    }
    return aligned(t);
}

/* Every layer's source weights (each expert's rows in turn: the experts are stacked rows) and
 * every edge case of quantize.txt. */
static void run_quantize(const char *dir, const mg_st_model *ref, const layer_case *cases,
                         int count) {
    char path[1024];
    snprintf(path, sizeof path, "%s/model", dir);
    mg_st_model *model = NULL;
    CHECK_OK(mg_st_open(path, &model));
    mg_st_tensor src, w, s, b;
    for (int i = 0; model && i < count; i++) {
        const layer_case *c = &cases[i];
        if (find_aligned(ref, c->name, "source", &src) &&
            find_aligned(model, c->name, "weight", &w) &&
            find_aligned(model, c->name, "scales", &s) &&
            find_aligned(model, c->name, "biases", &b))
            check_quantize(c->name, &src, &w, &s, &b, c->experts * c->n, c->k, c->bits, c->group);
    }
    mg_st_close(model);
    snprintf(path, sizeof path, "%s/quantize.txt", dir);
    FILE *f = fopen(path, "r");
    CHECK(f != NULL);
    char name[160], dtype[16];
    unsigned rows, k, bits, group, edge_cases = 0;
    while (f && fscanf(f, "%159s %u %u %u %u %15s", name, &rows, &k, &bits, &group, dtype) == 6) {
        edge_cases++;
        if (find_aligned(ref, name, "source", &src) && find_aligned(ref, name, "weight", &w) &&
            find_aligned(ref, name, "scales", &s) && find_aligned(ref, name, "biases", &b)) {
            CHECK((src.dtype == MG_ST_F16) == !strcmp(dtype, "float16"));
            check_quantize(name, &src, &w, &s, &b, rows, k, bits, group);
        }
    }
    if (f)
        fclose(f);
    CHECK(edge_cases == 12);

    /* refusals: each leaves the outputs as they were */
    uint16_t x[2 * 64], nan_x[2 * 64];
    for (int i = 0; i < 2 * 64; i++)
        x[i] = nan_x[i] = mg_f32_to_bf16((float)(i % 7) - 3.0f);
    nan_x[64 + 17] = 0x7fc0;
    uint32_t words[2 * 64 / 8];
    uint16_t scales[2], biases[2];
    memset(words, 0x5a, sizeof words);
    memset(scales, 0x5a, sizeof scales);
    memset(biases, 0x5a, sizeof biases);
    struct {
        const uint16_t *w;
        mg_dtype type;
        unsigned n, k, pitch, bits, group;
        const char *says;
    } bad[] = {
        {NULL, MG_DTYPE_BF16, 2, 64, 64, 4, 64, "null"},
        {x, MG_DTYPE_F32, 2, 64, 64, 4, 64, "type"},
        {x, MG_DTYPE_BF16, 2, 64, 64, 3, 64, "bits"},
        {x, MG_DTYPE_BF16, 2, 64, 64, 4, 16, "group_size"},
        {x, MG_DTYPE_BF16, 2, 48, 48, 4, 32, "multiple"},
        {x, MG_DTYPE_BF16, 0, 64, 64, 4, 64, "positive"},
        {x, MG_DTYPE_BF16, 1, 64, 32, 4, 64, "pitch"},
        {nan_x, MG_DTYPE_BF16, 2, 64, 64, 4, 64, "row 1, column 17"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        mg_status st = mg_mlx_quantize(bad[i].w, bad[i].type, bad[i].n, bad[i].k, bad[i].pitch,
                                       bad[i].bits, bad[i].group, words, scales, biases);
        CHECK(st == MG_ERR_INVALID_ARGUMENT);
        CHECK(strstr(mg_last_error(), bad[i].says) != NULL);
        if (st != MG_ERR_INVALID_ARGUMENT || !strstr(mg_last_error(), bad[i].says))
            fprintf(stderr, "  refusal %zu (%s): status %d, \"%s\"\n", i, bad[i].says, (int)st,
                    mg_last_error());
    }
    bool untouched = true;
    for (size_t i = 0; i < sizeof words / sizeof *words; i++)
        untouched &= words[i] == 0x5a5a5a5au;
    CHECK(untouched && scales[0] == 0x5a5a && scales[1] == 0x5a5a && biases[0] == 0x5a5a &&
          biases[1] == 0x5a5a);
}

static int read_cases(const char *dir, layer_case *cases, int max) {
    char path[1024];
    snprintf(path, sizeof path, "%s/layers.txt", dir);
    FILE *f = fopen(path, "r");
    int n = 0;
    while (f && n < max &&
           fscanf(f, "%159s %u %u %u %u %u %15s", cases[n].name, &cases[n].experts, &cases[n].n,
                  &cases[n].k, &cases[n].bits, &cases[n].group, cases[n].dtype) == 7)
        n++;
    if (f)
        fclose(f);
    return n;
}

static void run_backend(mg_backend *b, const char *dir, const mg_st_model *ref,
                        const layer_case *cases, int count) {
    /* Even layers from the single file, odd ones from the shards: both readers, every case. */
    const char *layouts[2] = {"model", "sharded"};
    mg_st_model *models[2] = {NULL, NULL};
    mg_mlx_config *configs[2] = {NULL, NULL};
    char path[1024];
    for (int i = 0; i < 2; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, layouts[i]);
        CHECK_OK(mg_st_open(path, &models[i]));
        CHECK_OK(mg_mlx_config_open(path, &configs[i]));
        if (models[i]) {
            const char *format = mg_st_metadata(models[i], "format");
            CHECK(format && !strcmp(format, "mlx"));
        }
    }
    for (int i = 0; i < count; i++)
        if (models[i % 2] && configs[i % 2])
            run_layer(b, models[i % 2], configs[i % 2], ref, &cases[i]);
    for (int i = 0; i < 2; i++) {
        mg_st_close(models[i]);
        mg_mlx_config_close(configs[i]);
    }
}

int main(void) {
    const char *dir = getenv("METRALE_MLX_REFERENCE");
    if (!dir) {
        printf("test_mlx_reference: skipped: METRALE_MLX_REFERENCE is not set (ctest sets it)\n");
        return 77;
    }
    char path[1024];
    snprintf(path, sizeof path, "%s/SKIP", dir);
    FILE *skip = fopen(path, "r");
    if (skip) {
        char reason[512] = "";
        if (!fgets(reason, sizeof reason, skip))
            reason[0] = '\0';
        fclose(skip);
        printf("test_mlx_reference: skipped: %s", reason);
        return 77;
    }
    layer_case cases[32];
    int count = read_cases(dir, cases, 32);
    CHECK(count >= 13);
    snprintf(path, sizeof path, "%s/reference.safetensors", dir);
    mg_st_model *ref = NULL;
    CHECK_OK(mg_st_open(path, &ref));
    if (!ref)
        return test_finish();
    run_quantize(dir, ref, cases, count);
    mg_backend *cpu = NULL;
    CHECK_OK(mg_backend_open(MG_BACKEND_CPU, 0, &cpu));
    if (cpu) {
        run_backend(cpu, dir, ref, cases, count);
        mg_backend_close(cpu);
    }
    mg_backend_probe probe;
    mg_backend *cuda = NULL;
    if (mg_backend_probe_kind(MG_BACKEND_CUDA, &probe) == MG_OK && probe.usable &&
        mg_backend_open(MG_BACKEND_CUDA, 0, &cuda) == MG_OK) {
        printf("CUDA: running the same cases\n");
        run_backend(cuda, dir, ref, cases, count);
        mg_backend_close(cuda);
    } else {
        printf("CUDA: not usable here; CPU only\n");
    }
    mg_st_close(ref);
    for (size_t i = 0; i < tensor_copy_count; i++)
        free(tensor_copies[i]);
    return test_finish();
}
