/* cmd_run.c - `metrale-gpu run`: a model-shaped forward pass through the whole runtime
 * (src/model/model.h): deterministic random weights of a preset, the arena, a ragged prefill,
 * then decode steps (one captured CUDA graph replayed on CUDA, eager on the CPU backend), and
 * a summary of speeds against the memory-bound limit. After the timed steps, one more decode
 * step runs eagerly with the model's per-op timing spans (model.h mg_fwd_set_timing) for the
 * per-op times of the summary; --trace also records the prefill's spans and writes both passes
 * as a Chrome trace. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "commands.h"
#include "metrale/dtype.h"
#include "metrale/switches.h"
#include "model.h"

typedef struct run_args {
    const char *preset, *weights, *trace;
    const char *checkpoint; /* mlx8 / mlx4 weights */
    long batch, prompt_len, steps;
    long tp; /* --tp: devices the model is split over (model.h mg_fwd_create_tp) */
    unsigned long long seed;
    bool compare;
    bool unfused; /* --no-fusion */
} run_args;

static void run_usage(FILE *f) {
    size_t n;
    const mg_fwd_preset *p = mg_fwd_presets(&n);
    fprintf(
        f,
        "usage: metrale-gpu [--backend B] [--json] run [--preset NAME] "
        "[--weights bf16|fp8|nvfp4|mlx8|mlx4] [--batch N] [--prompt-len L] [--steps S] [--seed N] "
        "[--trace FILE] [--compare] [--no-fusion] [--tp N]\n"
        "--tp N: split the model over N devices of the backend (tensor parallelism: devices "
        "--device .. --device + N - 1; on the CPU backend N CPU devices of this process); with "
        "--compare, against the one-device run on the CPU\n"
        "--no-fusion: decode with the norms, residual adds and SiLU-mul as ops of their own "
        "(by default BF16 weights fold them into the GEMMs where the backend can)\n"
        "nvfp4: the layer matrices and the LM head quantized to NVFP4 at load "
        "(embedding, norms and MoE router stay BF16)\n"
        "mlx8, mlx4 [--checkpoint DIR]: the layer matrices MLX affine-quantized (groups of 64, "
        "BF16 scales): from DIR, else the preset's committed checkpoint (micro has one), else "
        "quantized at load as mx.quantize would (dense presets)\n"
        "fp8: the same matrices in FP8 E4M3 with one scale per output row, activations "
        "quantized per token on the device (MoE experts: grouped FP8 GEMMs)\n"
        "after the S timed decode steps one more runs eagerly with per-op timing spans "
        "(the summary's per-op times); --trace FILE writes the Chrome trace (JSON) of "
        "the prefill and that step\n"
        "presets (default: tiny on the CPU backend, llama-3-8b on a GPU):\n");
    for (size_t i = 0; i < n; i++)
        fprintf(f, "  %-14s %s\n", p[i].name, p[i].description);
}

/* The counts' ranges: --batch and --prompt-len from 1, --steps from 0 (a run without decode
 * steps); all up to 2^20. A preset's own limits (its arena's batch and tokens per pass) are
 * checked when the model is made, still before any output. */
#define RUN_COUNT_MAX (1l << 20)

static bool parse_count(const char *v, long min, long *out) {
    char *end = NULL;
    errno = 0;
    long x = v ? strtol(v, &end, 10) : -1;
    if (!v || !*v || *end || errno || x < min || x > RUN_COUNT_MAX)
        return false;
    *out = x;
    return true;
}

/* 0 on success, else the exit status (the message printed). */
static int parse_args(int argc, char **argv, run_args *a) {
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        bool ok = true, takes = true;
        const char *accepted = NULL; /* what the argument takes, for the message */
        long min = 0;
        if (!strcmp(arg, "--preset"))
            a->preset = v, ok = v != NULL, accepted = "a preset name (run --help lists them)";
        else if (!strcmp(arg, "--weights"))
            a->weights = v, ok = v != NULL, accepted = "bf16, fp8, nvfp4, mlx8 or mlx4";
        else if (!strcmp(arg, "--checkpoint"))
            a->checkpoint = v, ok = v != NULL, accepted = "an MLX checkpoint folder";
        else if (!strcmp(arg, "--trace"))
            a->trace = v, ok = v != NULL, accepted = "a file to write";
        else if (!strcmp(arg, "--batch"))
            min = 1, ok = parse_count(v, min, &a->batch);
        else if (!strcmp(arg, "--prompt-len"))
            min = 1, ok = parse_count(v, min, &a->prompt_len);
        else if (!strcmp(arg, "--steps"))
            min = 0, ok = parse_count(v, min, &a->steps);
        else if (!strcmp(arg, "--tp")) {
            ok = mg_cli_parse_tp(v, &a->tp);
            accepted = mg_cli_tp_accepted();
        } else if (!strcmp(arg, "--seed")) {
            char *end = NULL;
            errno = 0;
            a->seed = v ? strtoull(v, &end, 10) : 0;
            ok = v && *v && !*end && !errno && *v != '-';
            accepted = "an unsigned 64-bit integer";
        } else if (!strcmp(arg, "--compare"))
            a->compare = true, takes = false;
        else if (!strcmp(arg, "--no-fusion"))
            a->unfused = true, takes = false;
        else if (!strcmp(arg, "--help") || !strcmp(arg, "-h")) {
            run_usage(stdout);
            return -1;
        } else {
            fprintf(stderr, "metrale-gpu run: unknown argument '%s' (see run --help)\n", arg);
            return 2;
        }
        if (!ok) {
            char range[64];
            if (!accepted) { /* a count */
                snprintf(range, sizeof range, "a count from %ld to %ld (2^20)", min, RUN_COUNT_MAX);
                accepted = range;
            }
            if (v)
                fprintf(stderr, "metrale-gpu run: %s '%s': expected %s\n", arg, v, accepted);
            else
                fprintf(stderr, "metrale-gpu run: %s needs a value: %s\n", arg, accepted);
            return 2;
        }
        i += takes;
    }
    return 0;
}

/* One op's time in the profiled decode step (the spans named after it, summed). */
typedef struct op_time {
    char name[MG_TIMING_NAME_BYTES];
    double ms;
} op_time;

typedef struct run_result {
    double setup_s, prefill_s, first_step_ms, step_ms; /* step_ms: median-free mean */
    op_time *ops; /* the profiled step's ops in order of first launch; NULL when none */
    size_t op_count;
    double profiled_ms; /* the profiled step's lane span (the whole pass on the device) */
    uint32_t graph_steps, eager_steps;
    mg_fwd_info info;
    uint16_t *final_hidden; /* [batch, hidden] */
    int32_t *tokens;        /* [batch][steps + 1] */
    uint32_t token_count;
    uint64_t live_bytes, live_count; /* device memory (ledger) while the model exists */
} run_result;

static void run_result_free(run_result *r) {
    free(r->ops);
    free(r->final_hidden);
    free(r->tokens);
    memset(r, 0, sizeof *r);
}

static double seconds(void) {
    return mg_bench_now_us() * 1e-6;
}

/* Per-series span totals and counts of a timing object (index = series). */
typedef struct span_totals {
    size_t count;
    double *us;
    uint64_t *spans;
} span_totals;

static mg_status span_totals_read(mg_timing *t, span_totals *out) {
    mg_status st = mg_timing_harvest(t, NULL);
    out->count = mg_timing_summary_count(t);
    out->us = calloc(out->count + 1, sizeof *out->us);
    out->spans = calloc(out->count + 1, sizeof *out->spans);
    if (!out->us || !out->spans)
        return MG_ERR_OUT_OF_MEMORY;
    for (size_t i = 0; !st && i < out->count; i++) {
        mg_timing_summary sum;
        if (!(st = mg_timing_summary_get(t, i, &sum))) {
            out->us[i] = sum.total_us;
            out->spans[i] = sum.count;
        }
    }
    return st;
}

static void span_totals_free(span_totals *t) {
    free(t->us);
    free(t->spans);
}

/* The op spans (kernel series) and the decode lane of the profiled step: the totals now minus
 * those `before` it. */
static mg_status read_profile(mg_timing *t, const span_totals *before, run_result *r) {
    span_totals now = {0};
    mg_status st = span_totals_read(t, &now);
    if (!st && !(r->ops = calloc(now.count + 1, sizeof *r->ops)))
        st = MG_ERR_OUT_OF_MEMORY;
    for (size_t i = 0; !st && i < now.count; i++) {
        mg_timing_summary sum;
        if ((st = mg_timing_summary_get(t, i, &sum)))
            break;
        bool old = i < before->count;
        if (now.spans[i] == (old ? before->spans[i] : 0))
            continue; /* no span in the profiled step */
        double ms = (now.us[i] - (old ? before->us[i] : 0)) * 1e-3;
        if (sum.kind == MG_TIMING_LANE) {
            if (!strcmp(sum.name, "decode"))
                r->profiled_ms = ms;
            continue;
        }
        snprintf(r->ops[r->op_count].name, sizeof r->ops[0].name, "%s", sum.name);
        r->ops[r->op_count++].ms = ms;
    }
    span_totals_free(&now);
    return st;
}

/* --compare, step by step on the same inputs: the device run records its logits after every
 * pass; the CPU run then follows the device's greedy tokens (mg_fwd_force_tokens), so that a
 * near-tie, where the two backends' roundings pick different tokens, does not send the runs
 * down different paths and leave nothing comparable. Against each pass's device logits the
 * CPU run measures the logits' difference, checks that each side's token is the argmax of its
 * own logits (ties to the lowest id), and records where its own choice differed. */
typedef struct compare_trace {
    uint32_t batch, vocab, passes;
    float *logits;         /* [passes][batch][vocab]: the device run's */
    const int32_t *follow; /* [batch][passes]: the device's tokens; NULL in the device run */
    float *cpu_logits;     /* [batch][vocab]: the CPU run's, one pass */
    int32_t *forced;       /* [batch] */
    double logits_err;     /* the largest |device - CPU| logit over its row's largest |CPU| one */
    uint32_t logits_err_pass, logits_err_request;
    uint32_t differ;      /* (pass, request) pairs where the CPU chose another token */
    double widest_margin; /* the largest CPU margin of its choice over the device's, relative */
    uint32_t first_pass, first_request;
    int32_t first_device, first_cpu;
    bool not_argmax; /* a token that is not the argmax of its own side's logits */
    const char *bad_side;
    uint32_t bad_pass, bad_request;
    int32_t bad_token, bad_argmax;
} compare_trace;

/* The first index of the largest value of row[0..n) (NaN never wins): the argmax ops' rule. */
static int32_t row_argmax(const float *row, uint32_t n) {
    int32_t best = 0;
    bool found = false;
    for (uint32_t i = 0; i < n; i++)
        if (!isnan(row[i]) && (!found || row[i] > row[best]))
            best = (int32_t)i, found = true;
    return best;
}

static void note_not_argmax(compare_trace *t, uint32_t pass, uint32_t r, int32_t token,
                            int32_t argmax) {
    if (t->not_argmax)
        return;
    t->not_argmax = true;
    t->bad_side = t->follow ? "the CPU" : "here";
    t->bad_pass = pass, t->bad_request = r, t->bad_token = token, t->bad_argmax = argmax;
}

/* After pass `pass` (0: the prefill) of a run with a compare trace. */
static mg_status compare_pass(mg_fwd *m, compare_trace *t, uint32_t pass) {
    if (!t || pass >= t->passes)
        return MG_OK;
    const size_t row_floats = t->vocab;
    float *dev = t->logits + (size_t)pass * t->batch * row_floats;
    mg_status st = mg_fwd_logits(m, t->follow ? t->cpu_logits : dev);
    for (uint32_t r = 0; !st && r < t->batch; r++) {
        uint32_t count;
        const int32_t token = mg_fwd_tokens(m, r, &count)[count - 1];
        const float *own = (t->follow ? t->cpu_logits : dev) + r * row_floats;
        const int32_t best = row_argmax(own, t->vocab);
        if (token != best)
            note_not_argmax(t, pass, r, token, best);
        if (!t->follow)
            continue;
        const float *d = dev + r * row_floats;
        double diff = 0, scale = 0;
        for (uint32_t i = 0; i < t->vocab; i++) {
            diff = isnan(own[i]) != isnan(d[i]) ? INFINITY : fmax(diff, fabs(own[i] - d[i]));
            scale = fmax(scale, fabs(own[i]));
        }
        const double err = scale > 0 ? diff / scale : diff;
        if (err > t->logits_err || (pass == 0 && r == 0))
            t->logits_err = err, t->logits_err_pass = pass, t->logits_err_request = r;
        const int32_t device = t->follow[(size_t)r * t->passes + pass];
        if (token != device) {
            const double margin = scale > 0 ? (own[token] - own[device]) / scale : INFINITY;
            if (!t->differ++)
                t->first_pass = pass, t->first_request = r, t->first_device = device,
                t->first_cpu = token;
            t->widest_margin = fmax(t->widest_margin, margin);
        }
        t->forced[r] = device;
    }
    if (!st && t->follow)
        st = mg_fwd_force_tokens(m, t->forced);
    return st;
}

/* Runs the whole pass on `b`; prints progress lines unless quiet. With `profile`, the last of
 * c->steps decode steps is the profiled eager one (per-op spans into r->ops); with `trace`
 * (needs profile) the prefill is recorded too and both are written to that file. 0 or 1
 * (message printed). */
static int run_model(mg_backend *const *ranks, int tp, const mg_fwd_config *c, bool quiet,
                     bool profile, const char *trace, compare_trace *cmp, run_result *r) {
    mg_backend *b = ranks[0]; /* the stream's, the timing's; the model's rank 0 */
    const char *kind = mg_backend_kind_name(mg_backend_get_kind(b));
    mg_stream *s = NULL;
    mg_fwd *m = NULL;
    mg_timing *timing = NULL;
    span_totals before = {0};
    const char *failed_what = NULL; /* a failed timing call: the library's message */
    mg_status st = mg_stream_create(b, &s);
    if (st) {
        fprintf(stderr, "metrale-gpu run: creating a stream: %s\n", mg_last_error());
        return 1;
    }
    mg_timing_options topts = {.level = MG_TELEMETRY_KERNEL, .kernel_span_every = 1};
    if ((profile || trace) && (st = mg_timing_create(b, &topts, &timing))) {
        fprintf(stderr, "metrale-gpu run: creating the timing spans: %s\n", mg_last_error());
        mg_stream_destroy(s);
        return 1;
    }
    double t0 = seconds();
    if ((st = mg_fwd_create_tp(ranks, tp, c, &m))) {
        fprintf(stderr, "metrale-gpu run: %s\n", mg_last_error());
        mg_timing_destroy(timing);
        mg_stream_destroy(s);
        return 1;
    }
    r->setup_s = seconds() - t0;
    mg_fwd_get_info(m, &r->info);
    if (!quiet) {
        /* the header only once mg_fwd_create has accepted the configuration: an argument it
         * refuses (a batch or prompt the preset's arena cannot hold) is then the only line */
        printf("metrale-gpu run: preset %s (%s) on %s, batch %u, prompts ~%u tokens, %u decode "
               "steps, %s weights",
               c->preset->name, c->preset->description, kind, c->batch, c->prompt_len,
               c->steps - profile, mg_fwd_weights_name(c->weights));
        if (tp > 1)
            printf(", tensor-parallel over %d devices (rank 0's numbers below)", tp);
        printf("\n");
        printf("[%s] weights: %.4g GB (seed %llu), KV cache %.4g MB, arena %.3f MB packed "
               "(%.3f MB unpacked), %.2f s\n",
               kind, r->info.weight_bytes / 1e9, (unsigned long long)c->seed,
               r->info.kv_pool_bytes / 1e6, r->info.arena.arena_bytes / 1e6,
               r->info.arena.sum_bytes / 1e6, r->setup_s);
        fflush(stdout);
    }
    if (trace && (st = mg_fwd_set_timing(m, timing)))
        goto failed;
    t0 = seconds();
    if ((st = mg_fwd_prefill(m, s)))
        goto failed;
    r->prefill_s = seconds() - t0;
    if ((st = compare_pass(m, cmp, 0)))
        goto failed;
    if (trace && ((st = mg_fwd_set_timing(m, NULL)) || (st = span_totals_read(timing, &before)))) {
        failed_what = "reading the prefill's spans";
        goto failed;
    }
    if (!quiet) {
        printf("[%s] prefill: %llu tokens of %u requests in %.3f s%s\n", kind,
               (unsigned long long)r->info.prompt_tokens, c->batch, r->prefill_s,
               trace ? " (with op spans for --trace)" : "");
        fflush(stdout);
    }
    double graph_total = 0;
    uint32_t steps = c->steps - (profile ? 1 : 0); /* the timed ones */
    for (uint32_t i = 0; i < steps; i++) {
        t0 = seconds();
        if ((st = mg_fwd_decode(m, s)))
            goto failed;
        double dt = seconds() - t0;
        if ((st = compare_pass(m, cmp, i + 1)))
            goto failed;
        mg_fwd_get_info(m, &r->info);
        if (i == 0) {
            r->first_step_ms = dt * 1e3;
            if (!quiet && c->use_graphs && steps > 1) {
                printf("[%s] decode step 1 eager (plans every GEMM shape) in %.3f ms; capturing "
                       "step 2\n",
                       kind, r->first_step_ms);
                fflush(stdout);
            }
        } else if (i == 1 && c->use_graphs) {
            if (!quiet)
                printf("[%s] capture + first replay: %.3f ms\n", kind, dt * 1e3);
        } else {
            graph_total += dt;
        }
    }
    uint32_t timed = steps > 2 ? steps - 2 : 0;
    if (!c->use_graphs) {
        timed = steps > 1 ? steps - 1 : 0;
    }
    r->step_ms = timed ? graph_total * 1e3 / timed : r->first_step_ms;
    r->graph_steps = r->info.graph_steps;
    r->eager_steps = steps - r->graph_steps;
    if (profile) {
        /* Spans cannot be recorded inside a graph: the profiled step runs eagerly (model.h). */
        if ((st = mg_fwd_set_timing(m, timing)))
            goto failed;
        if ((st = mg_fwd_decode(m, s)) || (st = compare_pass(m, cmp, c->steps)))
            goto failed;
        if ((st = mg_fwd_set_timing(m, NULL)) || (st = read_profile(timing, &before, r))) {
            failed_what = "reading the profiled step's spans";
            goto failed;
        }
        if (!quiet) {
            printf("[%s] profiled decode step: eager%s, one span per op, %.3f ms on the device\n",
                   kind, c->use_graphs ? " (a graph replay cannot hold timing spans)" : "",
                   r->profiled_ms);
            fflush(stdout);
        }
    }
    if (trace) {
        if ((st = mg_timing_export_chrome_trace(timing, trace))) {
            failed_what = "--trace";
            goto failed;
        }
        if (!quiet) {
            printf("[%s] trace: the prefill and %s decode step written to %s\n", kind,
                   !c->steps       ? "no (--steps 0)"
                   : c->use_graphs ? "one EAGER (not graph-replayed)"
                                   : "one",
                   trace);
            fflush(stdout);
        }
    }
    r->final_hidden = malloc((size_t)c->batch * c->preset->shape.hidden * 2);
    r->tokens = malloc((size_t)c->batch * (c->steps + 1) * sizeof(int32_t));
    if (!r->final_hidden || !r->tokens) {
        fprintf(stderr, "metrale-gpu run: out of host memory\n");
        mg_fwd_destroy(m);
        mg_timing_destroy(timing);
        span_totals_free(&before);
        mg_stream_destroy(s);
        return 1;
    }
    if ((st = mg_fwd_final_hidden(m, r->final_hidden)))
        goto failed;
    for (uint32_t q = 0; q < c->batch; q++) {
        const int32_t *t = mg_fwd_tokens(m, q, &r->token_count);
        memcpy(r->tokens + (size_t)q * (c->steps + 1), t, r->token_count * sizeof(int32_t));
    }
    mg_ledger_live(b, &r->live_bytes, &r->live_count);
    mg_fwd_destroy(m);
    mg_timing_destroy(timing);
    span_totals_free(&before);
    mg_stream_destroy(s);
    return 0;
failed:
    if (failed_what)
        fprintf(stderr, "metrale-gpu run: %s: %s\n", failed_what,
                st == MG_ERR_OUT_OF_MEMORY ? "out of host memory" : mg_last_error());
    else
        fprintf(stderr, "metrale-gpu run: %s\n", mg_last_error());
    mg_fwd_destroy(m);
    mg_timing_destroy(timing);
    span_totals_free(&before);
    mg_stream_destroy(s);
    return 1;
}

/* The largest |a - b| over the largest |b| of BF16 vectors (a norm-wise relative error that
 * near-zero elements cannot blow up). */
static double max_relative_error(const uint16_t *a, const uint16_t *b, size_t n) {
    double diff = 0, scale = 0;
    for (size_t i = 0; i < n; i++) {
        double x = mg_bf16_to_f32(a[i]), y = mg_bf16_to_f32(b[i]);
        if (isnan(x) != isnan(y))
            return INFINITY;
        diff = fmax(diff, fabs(x - y));
        scale = fmax(scale, fabs(y));
    }
    return scale > 0 ? diff / scale : diff;
}

int mg_cmd_run(int argc, char **argv, const mg_cli_options *opts) {
    for (int i = 1; i < argc; i++) /* a real checkpoint: cmd_run_model.c */
        if (!strcmp(argv[i], "--model"))
            return mg_cmd_run_model(argc, argv, opts);
    run_args a = {.batch = -1, .prompt_len = -1, .steps = -1, .seed = 1};
    int rc = parse_args(argc, argv, &a);
    if (rc)
        return rc < 0 ? 0 : rc;
    int weights = a.weights ? mg_fwd_weights_find(a.weights) : MG_FWD_WEIGHTS_BF16;
    if (weights < 0) {
        fprintf(stderr,
                "metrale-gpu run: --weights %s: bf16, fp8, nvfp4, mlx8 and mlx4 are the weight "
                "formats\n",
                a.weights);
        return 2;
    }
    bool mlx = weights == MG_FWD_WEIGHTS_MLX8 || weights == MG_FWD_WEIGHTS_MLX4;
    if (a.checkpoint && !mlx) {
        fprintf(stderr, "metrale-gpu run: --checkpoint needs --weights mlx8 or mlx4\n");
        return 2;
    }
    if (a.trace) { /* refuse an unwritable path before the run rather than after it (appending
                    * probes without truncating a trace already there) */
        FILE *f = fopen(a.trace, "a");
        if (!f) {
            fprintf(stderr, "metrale-gpu run: --trace %s: cannot write the file: %s\n", a.trace,
                    strerror(errno));
            return 2;
        }
        fclose(f);
    }
    if (a.preset && !mg_fwd_preset_find(a.preset)) {
        fprintf(stderr, "metrale-gpu run: unknown preset '%s' (run --help lists them)\n", a.preset);
        return 2;
    }
    mg_backend *ranks[MG_COMM_MAX_RANKS] = {NULL};
    const int tp = a.tp > 0 ? (int)a.tp : 1;
    mg_status st = mg_cli_backends_open(opts, tp, ranks);
    if (st)
        return 1;
    mg_backend *b = ranks[0];
    bool on_cpu = mg_backend_get_kind(b) == MG_BACKEND_CPU;
    const mg_fwd_preset *p = mg_fwd_preset_find(a.preset ? a.preset
                                                : mlx    ? "micro"
                                                : on_cpu ? "tiny"
                                                         : "llama-3-8b");
    mg_fwd_config c = mg_fwd_config_default(p);
    if (a.batch >= 0)
        c.batch = (uint32_t)a.batch;
    if (a.prompt_len >= 0)
        c.prompt_len = (uint32_t)a.prompt_len;
    if (a.steps >= 0)
        c.steps = (uint32_t)a.steps;
    /* One more decode step than the timed ones: the profiled eager step (none with --steps 0). */
    bool profile = c.steps > 0;
    c.steps += profile;
    c.seed = a.seed;
    c.use_graphs = !on_cpu;
    c.weights = (mg_fwd_weights)weights;
    c.checkpoint = a.checkpoint;
    c.unfused = a.unfused;
    const char *wname = mg_fwd_weights_name(c.weights);
    const char *kind = mg_backend_kind_name(mg_backend_get_kind(b));
    compare_trace cmp = {.batch = c.batch, .vocab = p->shape.vocab, .passes = c.steps + 1};
    if (a.compare) {
        const double bytes = 4.0 * cmp.passes * cmp.batch * cmp.vocab;
        if (bytes > (double)(1ull << 30)) {
            fprintf(stderr,
                    "metrale-gpu run: --compare keeps the logits of every pass: %.1f GB "
                    "for %u requests x %u passes x %u logits, more than 1 GiB (fewer "
                    "--steps or --batch)\n",
                    bytes / 1e9, cmp.batch, cmp.passes, cmp.vocab);
            mg_cli_backends_close(ranks, tp);
            return 2;
        }
        cmp.logits = malloc((size_t)bytes);
        cmp.cpu_logits = malloc((size_t)cmp.batch * cmp.vocab * sizeof(float));
        cmp.forced = malloc(cmp.batch * sizeof(int32_t));
        if (!cmp.logits || !cmp.cpu_logits || !cmp.forced) {
            fprintf(stderr, "metrale-gpu run: out of host memory for --compare\n");
            free(cmp.logits), free(cmp.cpu_logits), free(cmp.forced);
            mg_cli_backends_close(ranks, tp);
            return 1;
        }
    }
    run_result r = {0};
    if ((rc =
             run_model(ranks, tp, &c, opts->json, profile, a.trace, a.compare ? &cmp : NULL, &r))) {
        free(cmp.logits), free(cmp.cpu_logits), free(cmp.forced);
        mg_cli_backends_close(ranks, tp);
        return rc;
    }
    /* The memory-bound limit of a decode step: every weight it reads (all but the embedding
     * table; NVFP4 matrices as their prepared values + scales) and the KV cache of every
     * request, over the measured copy bandwidth. */
    mg_bench bench = {.backend = b, .opts = opts, .warmup = 3, .iters = on_cpu ? 5 : 20};
    double gbps = 0;
    if (!(st = mg_stream_create(b, &bench.stream))) {
        st = mg_bench_copy_bandwidth(&bench, on_cpu ? (64u << 20) : (1u << 30), &gbps);
        mg_stream_destroy(bench.stream);
    }
    if (st)
        fprintf(stderr, "metrale-gpu run: measuring the copy bandwidth failed: %s\n",
                mg_last_error());
    double step_bytes = (double)r.info.decode_weight_bytes + (double)r.info.decode_kv_bytes;
    double limit_ms = gbps > 0 ? step_bytes / (gbps * 1e6) : 0;
    double prefill_tps = r.prefill_s > 0 ? r.info.prompt_tokens / r.prefill_s : 0;
    double decode_tps = r.step_ms > 0 ? c.batch * 1e3 / r.step_ms : 0;
    uint64_t live = r.live_bytes, live_count = r.live_count;

    /* --compare: the same preset and seed on the CPU backend, following this run's tokens
     * (compare_trace). It agrees when every pass's logits are within logits_tolerance of the
     * CPU's (relative to the row's largest), each token is the argmax of its own side's logits,
     * and the final hidden states are within hidden_tolerance (test_forward_cuda's bounds). A
     * token the CPU would have chosen differently is then a near-tie: the logits' difference
     * covers its margin. Bounds (H200, 2026-12-01, bench/results): BF16, NVFP4 and MLX logits
     * within 0.008, FP8 within 0.05 (the LM head's input quantized to E4M3 per token: a one-ulp
     * BF16 difference may move an element by a whole E4M3 step); a MoE preset that routes to
     * fewer than all experts may send a token to another expert at a routing near-tie inside a
     * pass, which following the tokens cannot prevent (tiny-moe NVFP4: 0.053). */
    const bool fp8 = c.weights == MG_FWD_WEIGHTS_FP8;
    const bool routed = p->shape.experts && p->shape.experts_per_token < p->shape.experts;
    const double logits_tolerance = routed ? 0.15 : fp8 ? 0.08 : 0.03;
    const double hidden_tolerance = routed ? 0.1 : fp8 ? 0.04 : 0.03;
    double rel = -1;
    int agree = -1;
    bool compare_ok = false;
    if (a.compare) {
        /* One CPU backend per process: a run on the CPU compares with itself (what the test
         * of the comparison can do without a GPU). */
        mg_backend *cpu = on_cpu ? b : NULL;
        run_result ref = {0};
        if (!on_cpu && (st = mg_backend_open(MG_BACKEND_CPU, 0, &cpu))) {
            fprintf(stderr, "metrale-gpu run: cannot open the CPU backend: %s\n", mg_last_error());
            rc = 1;
        } else {
            mg_fwd_config cc = c;
            cc.use_graphs = false;
            if (!opts->json)
                printf("[cpu] the same run on the CPU backend for --compare\n");
            cmp.follow = r.tokens;
            rc = run_model(&cpu, 1, &cc, true, false, NULL, &cmp, &ref); /* one device */
            if (cpu != b)
                mg_backend_close(cpu);
        }
        if (!rc) {
            rel = max_relative_error(r.final_hidden, ref.final_hidden,
                                     (size_t)c.batch * p->shape.hidden);
            agree = cmp.differ == 0;
            compare_ok =
                !cmp.not_argmax && cmp.logits_err <= logits_tolerance && rel <= hidden_tolerance;
            if (!compare_ok)
                rc = 1; /* a disagreement fails the command (reported in the summary) */
        }
        run_result_free(&ref);
    }
    free(cmp.logits), free(cmp.cpu_logits), free(cmp.forced);

    const int32_t *t0 = r.tokens;
    if (opts->json) {
        printf("{\"preset\": \"%s\", \"backend\": \"%s\", \"tp\": %d, \"weights\": \"%s\", "
               "\"batch\": %u, "
               "\"prompt_tokens\": %llu, \"steps\": %u, \"graph_steps\": %u, "
               "\"kernels_per_step\": %u, \"graph_nodes_per_step\": %u, "
               "\"kernels_per_layer\": %u, \"kernels_outside_layers\": %u, \"fused_decode\": %s, "
               "\"fused_qkv\": %s, \"fused_kv_append\": %s, "
               "\"setup_s\": %.4f, \"prefill_s\": %.6f, \"prefill_tokens_per_s\": %.2f, "
               "\"decode_ms_per_step\": %.4f, \"decode_tokens_per_s\": %.2f, "
               "\"first_step_ms\": %.4f, \"decode_bytes_per_step\": %.0f, "
               "\"copy_gbps\": %.2f, \"memory_bound_ms\": %.4f, \"fraction_of_limit\": %.4f, "
               "\"weight_bytes\": %llu, \"kv_pool_bytes\": %llu, \"arena_bytes\": %llu, "
               "\"arena_unpacked_bytes\": %llu, \"device_bytes_live\": %llu, \"tokens\": [",
               p->name, kind, tp, wname, c.batch, (unsigned long long)r.info.prompt_tokens,
               c.steps - profile, r.graph_steps, r.info.graph_kernels, r.info.graph_nodes,
               r.info.graph_layer_kernels, r.info.graph_outside_kernels,
               r.info.fused_decode ? "true" : "false", r.info.fused_qkv ? "true" : "false",
               r.info.fused_kv_append ? "true" : "false", r.setup_s, r.prefill_s, prefill_tps,
               r.step_ms, decode_tps, r.first_step_ms, step_bytes, gbps, limit_ms,
               r.step_ms > 0 ? limit_ms / r.step_ms : 0, (unsigned long long)r.info.weight_bytes,
               (unsigned long long)r.info.kv_pool_bytes,
               (unsigned long long)r.info.arena.arena_bytes,
               (unsigned long long)r.info.arena.sum_bytes, (unsigned long long)live);
        for (uint32_t i = 0; i < r.token_count; i++)
            printf("%s%d", i ? ", " : "", t0[i]);
        printf("], \"programmatic_launch\": %s",
               mg_programmatic_launch_enabled() ? "true" : "false");
        printf(", \"profiled_step_ms\": %.4f, \"per_op_ms\": {", r.profiled_ms);
        for (size_t i = 0; i < r.op_count; i++)
            printf("%s\"%s\": %.4f", i ? ", " : "", r.ops[i].name, r.ops[i].ms);
        printf("}");
        if (a.trace) {
            printf(", \"trace\": \"");
            for (const char *ch = a.trace; *ch; ch++) { /* a JSON string */
                if ((unsigned char)*ch < 0x20)
                    printf("\\u%04x", (unsigned)*ch);
                else
                    printf("%s%c", *ch == '"' || *ch == '\\' ? "\\" : "", *ch);
            }
            printf("\"");
        }
        if (a.compare)
            printf(", \"compare_agree\": %s, \"compare_max_rel_err\": %.6g, "
                   "\"compare_logits_max_rel_err\": %.6g, \"compare_tokens_agree\": %s, "
                   "\"compare_near_ties\": %u, \"compare_widest_near_tie\": %.6g, "
                   "\"compare_first_differing_token\": %d, \"compare_argmax_ok\": %s",
                   compare_ok ? "true" : "false", rel, cmp.logits_err,
                   agree == 1 ? "true" : "false", cmp.differ, cmp.widest_margin,
                   cmp.differ ? (int)cmp.first_pass : -1, cmp.not_argmax ? "false" : "true");
        printf("}\n");
    } else {
        printf("summary (%s, %s, %s weights):\n", p->name, kind, wname);
        printf("  prefill         %.1f tokens/s (%llu tokens in %.3f s)\n", prefill_tps,
               (unsigned long long)r.info.prompt_tokens, r.prefill_s);
        printf("  decode          %.3f ms/step, %.1f tokens/s at batch %u (%s; first eager "
               "step %.3f ms)\n",
               r.step_ms, decode_tps, c.batch, r.graph_steps ? "graph replays" : "eager steps",
               r.first_step_ms);
        printf("  decode GEMMs    %s\n",
               !r.info.fused_decode
                   ? tp > 1 ? "unfused (tensor-parallel: the fused residual adds need whole rows)"
                            : "unfused (--no-fusion, or no fusing provider at this batch)"
               : r.info.fused_kv_append
                   ? "fused (norms, residual adds and SiLU-mul folded in; q and kv in one GEMV "
                     "with RoPE and the KV append)"
               : r.info.fused_qkv
                   ? "fused (norms, residual adds and SiLU-mul folded in; q and kv in one GEMV)"
                   : "fused (norms, residual adds and SiLU-mul folded in)");
        if (r.info.graph_layer_kernels)
            printf("  decode graph    %u kernels, %u nodes per step: %u per layer, %u outside "
                   "the layers (embedding, final norm, LM head, argmax or sampling)\n",
                   r.info.graph_kernels, r.info.graph_nodes, r.info.graph_layer_kernels,
                   r.info.graph_outside_kernels);
        else if (r.info.graph_kernels)
            printf("  decode graph    %u kernels, %u nodes per step (%.1f kernels per layer on "
                   "average, the LM head and sampling included)\n",
                   r.info.graph_kernels, r.info.graph_nodes,
                   (double)r.info.graph_kernels / p->layers);
        printf("  memory bound    %.3f ms/step: %.3f GB of weights + KV read per step at %.1f "
               "GB/s copy bandwidth; %.1f%% reached\n",
               limit_ms, step_bytes / 1e9, gbps, r.step_ms > 0 ? 100 * limit_ms / r.step_ms : 0);
        printf("  arena           %.3f MB packed, %.3f MB unpacked\n",
               r.info.arena.arena_bytes / 1e6, r.info.arena.sum_bytes / 1e6);
        printf("  device memory   %.3f GB in %llu allocations (weights, KV cache, arena)\n",
               live / 1e9, (unsigned long long)live_count);
        if (r.op_count) {
            printf("  per-op          one %s decode step after the timed ones, %.3f ms on the "
                   "device (ms, %% of the step):\n",
                   c.use_graphs ? "eager (graph replays hold no spans)" : "eager", r.profiled_ms);
            for (size_t i = 0; i < r.op_count; i++)
                printf("    %-14s %10.4f %6.1f%%\n", r.ops[i].name, r.ops[i].ms,
                       r.profiled_ms > 0 ? 100 * r.ops[i].ms / r.profiled_ms : 0);
        }
        printf("  request 0       ");
        for (uint32_t i = 0; i < r.token_count; i++)
            printf("%s%d", i ? " " : "", t0[i]);
        printf("\n");
        if (a.compare && agree >= 0) {
            printf("  compare         %s: the CPU on the same inputs (it follows the tokens "
                   "chosen here): logits within %.3g of the row's largest (pass %u, request %u; "
                   "bound %.3g), final hidden states within %.3g (bound %.3g); ",
                   compare_ok ? "AGREE" : "DISAGREE", cmp.logits_err, cmp.logits_err_pass,
                   cmp.logits_err_request, logits_tolerance, rel, hidden_tolerance);
            if (cmp.not_argmax)
                printf("token %d of request %u at pass %u %s is not the argmax of its logits "
                       "(%d)\n",
                       cmp.bad_token, cmp.bad_request, cmp.bad_pass, cmp.bad_side, cmp.bad_argmax);
            else if (!cmp.differ)
                printf("greedy tokens agree\n");
            else
                printf("greedy tokens agree but for %u near-tie%s (first at pass %u of request "
                       "%u: %d here, %d on the CPU; widest CPU margin %.3g of the row's largest "
                       "logit)\n",
                       cmp.differ, cmp.differ > 1 ? "s" : "", cmp.first_pass, cmp.first_request,
                       cmp.first_device, cmp.first_cpu, cmp.widest_margin);
        }
    }
    run_result_free(&r);
    mg_cli_backends_close(ranks, tp);
    return rc;
}
