/* bench_gemm_providers.c - `metrale-gpu bench gemm_providers`: the BF16 GEMM providers side by
 * side, to fill the CUTLASS table (src/ops/gemm/gemm_cutlass_table.c). For every shape it times
 * cuBLASLt and each CUTLASS kernel configuration under graph replay, one GEMM per weight of a
 * rotation larger than L2 (as a model's layers stream their weights), then prints the table
 * rows to paste: one C row per shape where the best CUTLASS configuration beats cuBLASLt by at
 * least --min-margin (default 1.03), and a comment for each shape cuBLASLt keeps.
 *
 * Shapes: `bench gemm`'s (N, K) pairs and the Llama-3-8B projections (fused QKV 6144x4096,
 * O 4096x4096, gate 14336x4096, fused gate+up 28672x4096, down 4096x14336), at M in
 * {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192} (--m LIST to choose), plus
 * 8192^3 and 16384x8192x8192 (skipped with --m).
 *
 * The provider is forced by name (mg_op_force_provider); the CUTLASS configuration by the
 * environment variable METRALE_CUTLASS_GEMM_CONFIG, which, while "cutlass" is forced, pins the
 * configuration and makes a call it cannot run fail instead of falling back to cuBLASLt, so a
 * CUTLASS row never measures cuBLASLt. --only filters on the shape ("4096x14336"). The rows go to
 * stdout, or to stderr with --json. Needs a GPU with graphs; on the CPU backend it has
 * nothing to compare and prints nothing. */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "metrale/ops.h"
#include "metrale/ops_gemm.h"

/* The CUTLASS configurations, as src/ops/gemm/gemm_cutlass_table.c names them. */
static const char *const cutlass_configs[] = {"coop_128x128", "coop_128x256", "pingpong_64x128"};
#define CONFIG_COUNT (sizeof cutlass_configs / sizeof cutlass_configs[0])
#define CONFIG_ENV "METRALE_CUTLASS_GEMM_CONFIG"

typedef struct provider_case {
    uint32_t m, n, k;
    mg_devptr act, out;
    mg_bench_rotation weights;
} provider_case;

static mg_status body(mg_bench *b, void *arg, int iteration) {
    provider_case *c = arg;
    mg_status st = MG_OK;
    for (int i = 0; !st && i < c->weights.count; i++)
        st = mg_gemm_bf16(b->backend, b->stream, c->m, c->n, c->k, c->act,
                          mg_bench_rotation_get(&c->weights, iteration * c->weights.count + i),
                          c->out, MG_DTYPE_BF16, c->n);
    return st;
}

/* Times the current provider on `c`: median microseconds per GEMM, or a negative value when it
 * cannot run the shape (the reason goes to stderr). */
static double time_provider(mg_bench *b, provider_case *c, const char *label) {
    char shape[64];
    snprintf(shape, sizeof shape, "%ux%ux%u", c->m, c->n, c->k);
    mg_bench_row row = mg_bench_row_make("gemm_providers", label, shape);
    mg_status st = body(b, c, 0); /* plans the shape outside the capture */
    if (!st)
        st = mg_stream_synchronize(b->stream);
    if (!st)
        st = mg_bench_time_graph(b, body, c, b->warmup, b->iters, &row.stats);
    if (st) {
        fprintf(stderr, "bench gemm_providers %s %s: %s: %s\n", label, shape, mg_status_name(st),
                mg_last_error());
        mg_stream_synchronize(b->stream);
        return -1.0;
    }
    double gemms = c->weights.count;
    snprintf(row.timing, sizeof row.timing, "graph");
    row.flops = gemms * 2.0 * c->m * c->n * c->k;
    row.bytes = gemms * (double)c->weights.bytes;
    row.items = gemms;
    snprintf(row.item_unit, sizeof row.item_unit, "gemm");
    snprintf(row.note, sizeof row.note, "GB/s of weights; %d weights rotated", c->weights.count);
    mg_bench_add(b, &row);
    return row.stats.median_us / gemms;
}

/* The CUTLASS table row (or the comment) for one measured shape. */
static void print_choice(FILE *f, const provider_case *c, double lt_us, const double *cutlass_us,
                         double min_margin) {
    int best = -1;
    for (size_t i = 0; i < CONFIG_COUNT; i++)
        if (cutlass_us[i] > 0 && (best < 0 || cutlass_us[i] < cutlass_us[best]))
            best = (int)i;
    if (lt_us <= 0) {
        fprintf(f, "    /* M=%u N=%u K=%u: cuBLASLt failed, not measured */\n", c->m, c->n, c->k);
        return;
    }
    if (best < 0) {
        fprintf(f, "    /* M=%u N=%u K=%u: cuBLASLt (%.1f us); no CUTLASS configuration ran */\n",
                c->m, c->n, c->k, lt_us);
        return;
    }
    double margin = lt_us / cutlass_us[best];
    if (margin >= min_margin) {
        char upper[32];
        size_t i = 0;
        for (; cutlass_configs[best][i] && i + 1 < sizeof upper; i++)
            upper[i] = (char)toupper((unsigned char)cutlass_configs[best][i]);
        upper[i] = '\0';
        fprintf(f,
                "    {%u, %u, %u, %u, MG_CUTLASS_DENSE_%s, %.2ff}, /* cuBLASLt %.1f us, CUTLASS "
                "%.1f us */\n",
                c->m, c->m, c->n, c->k, upper, margin, lt_us, cutlass_us[best]);
    } else {
        fprintf(f, "    /* M=%u N=%u K=%u: cuBLASLt %.1f us; best CUTLASS %s %.1f us (%.2fx) */\n",
                c->m, c->n, c->k, lt_us, cutlass_configs[best], cutlass_us[best], margin);
    }
}

static int run_shape(mg_bench *b, uint32_t m, uint32_t n, uint32_t k, double min_margin) {
    char shape[64];
    snprintf(shape, sizeof shape, "%ux%ux%u", m, n, k);
    if (!mg_bench_selected(b, shape))
        return 0;
    provider_case c = {.m = m, .n = n, .k = k};
    size_t weight_bytes = (size_t)n * k * 2;
    int failures = 0;
    mg_status st;
    if ((st = mg_alloc(b->backend, (size_t)m * k * 2, &c.act)) ||
        (st = mg_bench_fill_random_device(b, c.act, (size_t)m * k * 2, 7)) ||
        (st = mg_alloc(b->backend, (size_t)m * n * 2, &c.out)) ||
        (st = mg_bench_rotation_create(b, weight_bytes, 2, &c.weights))) {
        failures = mg_bench_fail(b, shape);
        goto done;
    }
    double lt_us, cutlass_us[CONFIG_COUNT];
    if ((st = mg_op_force_provider(b->backend, MG_OP_GEMM_BF16, "cublaslt"))) {
        failures = mg_bench_fail(b, shape);
        goto done;
    }
    lt_us = time_provider(b, &c, "cublaslt");
    failures += lt_us < 0;
    bool have_cutlass = mg_op_force_provider(b->backend, MG_OP_GEMM_BF16, "cutlass") == MG_OK;
    for (size_t i = 0; i < CONFIG_COUNT; i++) {
        cutlass_us[i] = -1.0;
        if (!have_cutlass)
            continue;
        char label[48];
        snprintf(label, sizeof label, "cutlass_%s", cutlass_configs[i]);
        setenv(CONFIG_ENV, cutlass_configs[i], 1);
        cutlass_us[i] = time_provider(b, &c, label);
    }
    unsetenv(CONFIG_ENV);
    mg_op_force_provider(b->backend, MG_OP_GEMM_BF16, NULL);
    print_choice(b->opts->json ? stderr : stdout, &c, lt_us, cutlass_us, min_margin);
done:
    if (c.weights.buffers)
        mg_bench_rotation_destroy(b, &c.weights);
    mg_free(b->backend, c.act);
    mg_free(b->backend, c.out);
    return failures;
}

static double option_double(int argc, char **argv, const char *name, double fallback) {
    for (int i = 1; i + 1 < argc; i++)
        if (!strcmp(argv[i], name))
            return strtod(argv[i + 1], NULL);
    return fallback;
}

static int bench_gemm_providers(mg_bench *b, int argc, char **argv) {
    static const uint32_t default_m[] = {1,   2,   4,   8,    16,   32,   64,
                                         128, 256, 512, 1024, 2048, 4096, 8192};
    /* (N, K): bench gemm's pairs, then the Llama-3-8B projections not among them. */
    static const uint32_t nk[][2] = {
        {4096, 4096}, {14336, 4096}, {4096, 14336}, {6144, 4096}, {28672, 4096}};
    static const uint32_t big[][3] = {{8192, 8192, 8192}, {16384, 8192, 8192}};
    if (b->info.cc_major == 0) {
        fprintf(stderr, "bench gemm_providers: compares the CUDA GEMM providers; nothing to do "
                        "on this backend\n");
        return 0;
    }
    uint32_t ms[32];
    size_t m_count = mg_bench_option_u32_list(argc, argv, "--m", ms, 32);
    bool custom_m = m_count > 0;
    if (!custom_m) {
        m_count = b->quick ? 2 : sizeof default_m / sizeof default_m[0];
        memcpy(ms, b->quick ? (const uint32_t[]){1, 256} : default_m, m_count * sizeof *ms);
    }
    double min_margin = option_double(argc, argv, "--min-margin", 1.03);
    size_t nk_count = b->quick ? 1 : sizeof nk / sizeof nk[0];
    int failures = 0;
    fprintf(b->opts->json ? stderr : stdout,
            "/* bench gemm_providers on %s: rows for src/ops/gemm/gemm_cutlass_table.c "
            "(min margin %.2f) */\n",
            b->info.name, min_margin);
    for (size_t s = 0; s < nk_count; s++)
        for (size_t i = 0; i < m_count; i++)
            failures += run_shape(b, ms[i], nk[s][0], nk[s][1], min_margin);
    for (size_t s = 0; !b->quick && !custom_m && s < 2; s++)
        failures += run_shape(b, big[s][0], big[s][1], big[s][2], min_margin);
    fflush(stdout);
    return failures;
}

MG_BENCH_REGISTER(gemm_providers, "gemm_providers",
                  "BF16 GEMM: cuBLASLt vs each CUTLASS configuration under graph replay; prints "
                  "the rows of the CUTLASS table",
                  bench_gemm_providers)
