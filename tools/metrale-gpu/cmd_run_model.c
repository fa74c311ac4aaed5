/* cmd_run_model.c - `metrale-gpu run --model PATH`: a real checkpoint through the forward pass
 * (src/model/model.h with config.model_path): load, one prefill of the given prompt, then
 * greedy decode steps or, with --teacher-force, steps fed a given continuation; prints the ids
 * and the speed against the memory-bound limit, and with --top-logits K each step's K largest
 * logits (for teacher-forced comparisons with independent implementations). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "commands.h"
#include "model.h"

#define MAX_IDS (1u << 16)

typedef struct model_args {
    const char *model;
    int32_t *prompt, *teacher;
    uint32_t prompt_count, teacher_count;
    long steps, top_logits;
} model_args;

static void model_usage(FILE *f) {
    fprintf(f,
            "usage: metrale-gpu [--backend B] [--json] run --model FILE.gguf --prompt-ids IDS "
            "[--steps N | --teacher-force IDS] [--top-logits K]\n"
            "IDS: comma-separated token ids. Runs the checkpoint's network (GGUF: llama "
            "architecture; Q4_0/Q4_1/Q8_0 matrices on the MLX kernels, F16/BF16/F32 as BF16):\n"
            "one prefill of the prompt, then N greedy decode steps (default 32), or one step "
            "per id of --teacher-force, each fed that id instead of the prediction.\n"
            "--top-logits K adds each step's K largest logits (--json: \"steps\": [{\"id\", "
            "\"top\": [[id, logit], ...]}]).\n");
}

/* "1,2,3" into a new array; false (message printed) for anything else. */
static bool parse_ids(const char *flag, const char *v, int32_t **out, uint32_t *count) {
    if (!v || !*v) {
        fprintf(stderr, "metrale-gpu run: %s needs comma-separated token ids\n", flag);
        return false;
    }
    uint32_t n = 1;
    for (const char *p = v; *p; p++)
        n += *p == ',';
    if (n > MAX_IDS) {
        fprintf(stderr, "metrale-gpu run: %s: more than %u ids\n", flag, MAX_IDS);
        return false;
    }
    int32_t *ids = malloc(n * sizeof *ids);
    if (!ids) {
        fprintf(stderr, "metrale-gpu run: out of host memory\n");
        return false;
    }
    const char *p = v;
    for (uint32_t i = 0; i < n; i++) {
        char *end = NULL;
        errno = 0;
        long x = strtol(p, &end, 10);
        if (end == p || errno || x < 0 || x > INT32_MAX || (*end && *end != ',')) {
            fprintf(stderr, "metrale-gpu run: %s: id %u ('%.*s') is not a token id\n", flag, i,
                    (int)strcspn(p, ","), p);
            free(ids);
            return false;
        }
        ids[i] = (int32_t)x;
        p = *end ? end + 1 : end;
    }
    *out = ids;
    *count = n;
    return true;
}

static bool parse_long(const char *flag, const char *v, long max, long *out) {
    char *end = NULL;
    long x = v ? strtol(v, &end, 10) : -1;
    if (!v || !*v || *end || x < 0 || x > max) {
        fprintf(stderr, "metrale-gpu run: %s needs a count from 0 to %ld\n", flag, max);
        return false;
    }
    *out = x;
    return true;
}

/* 0, or the exit status (message printed); -1 for --help. */
static int parse_model_args(int argc, char **argv, model_args *a) {
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        bool ok;
        if (!strcmp(arg, "--model")) {
            ok = v != NULL;
            a->model = v;
            if (!ok)
                fprintf(stderr, "metrale-gpu run: --model needs a path\n");
        } else if (!strcmp(arg, "--prompt-ids")) {
            free(a->prompt);
            ok = parse_ids(arg, v, &a->prompt, &a->prompt_count);
        } else if (!strcmp(arg, "--teacher-force")) {
            free(a->teacher);
            ok = parse_ids(arg, v, &a->teacher, &a->teacher_count);
        } else if (!strcmp(arg, "--steps")) {
            ok = parse_long(arg, v, 1l << 20, &a->steps);
        } else if (!strcmp(arg, "--top-logits")) {
            ok = parse_long(arg, v, 1024, &a->top_logits);
        } else if (!strcmp(arg, "--help") || !strcmp(arg, "-h")) {
            model_usage(stdout);
            return -1;
        } else {
            fprintf(stderr,
                    "metrale-gpu run: '%s' is not an argument of run --model (see run --model "
                    "x --help)\n",
                    arg);
            return 2;
        }
        if (!ok)
            return 2;
        i++;
    }
    if (!a->prompt) {
        fprintf(stderr, "metrale-gpu run: --model needs --prompt-ids\n");
        return 2;
    }
    if (a->teacher && a->steps >= 0) {
        fprintf(stderr, "metrale-gpu run: --steps and --teacher-force exclude each other\n");
        return 2;
    }
    return 0;
}

/* The k largest of x[0..n) (ties: the lower id first), into ids/values sorted descending. */
static void top_k(const float *x, uint32_t n, uint32_t k, int32_t *ids, float *values) {
    uint32_t have = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (have == k && !(x[i] > values[k - 1]))
            continue;
        uint32_t j = have < k ? have++ : k - 1;
        while (j > 0 && x[i] > values[j - 1]) {
            values[j] = values[j - 1];
            ids[j] = ids[j - 1];
            j--;
        }
        values[j] = x[i];
        ids[j] = (int32_t)i;
    }
}

int mg_cmd_run_model(int argc, char **argv, const mg_cli_options *opts) {
    model_args a = {.steps = -1};
    int rc = parse_model_args(argc, argv, &a);
    if (rc) {
        free(a.prompt);
        free(a.teacher);
        return rc < 0 ? 0 : rc;
    }
    const uint32_t steps = a.teacher ? a.teacher_count : a.steps >= 0 ? (uint32_t)a.steps : 32;
    mg_backend *b = NULL;
    mg_status st = mg_backend_open(opts->backend, opts->device, &b);
    if (st) {
        fprintf(stderr, "metrale-gpu run: cannot open the %s backend (device %d): %s\n",
                mg_backend_kind_name(opts->backend), opts->device, mg_last_error());
        free(a.prompt);
        free(a.teacher);
        return 1;
    }
    const bool on_cpu = mg_backend_get_kind(b) == MG_BACKEND_CPU;
    mg_fwd_config c = {.batch = 1, .steps = steps, .seed = 1, .use_graphs = !on_cpu,
                       .model_path = a.model, .prompt_ids = a.prompt,
                       .prompt_ids_count = a.prompt_count};
    mg_fwd *m = NULL;
    mg_stream *s = NULL;
    const uint32_t k = (uint32_t)a.top_logits;
    float *logits = NULL, *top_values = NULL;
    int32_t *top_ids = NULL;
    int32_t *predicted = calloc(steps + 1, sizeof *predicted); /* teacher forcing's greedy ids */
    double t0 = mg_bench_now_us();
    if ((st = mg_fwd_create(b, &c, &m))) {
        fprintf(stderr, "metrale-gpu run: %s\n", mg_fwd_error());
        rc = 1;
        goto done;
    }
    const double load_s = (mg_bench_now_us() - t0) * 1e-6;
    mg_fwd_weights w;
    const mg_fwd_preset *p = mg_fwd_get_preset(m, &w);
    const uint32_t vocab = p->shape.vocab, rows = k ? steps + 1 : 0;
    if (!predicted || (k && (!(logits = malloc((size_t)vocab * sizeof *logits)) ||
              !(top_values = malloc((size_t)rows * k * sizeof *top_values)) ||
              !(top_ids = malloc((size_t)rows * k * sizeof *top_ids))))) {
        fprintf(stderr, "metrale-gpu run: out of host memory\n");
        rc = 1;
        goto done;
    }
    if (k > vocab) {
        fprintf(stderr, "metrale-gpu run: --top-logits %u exceeds the vocabulary (%u)\n", k,
                vocab);
        rc = 2;
        goto done;
    }
    if ((st = mg_stream_create(b, &s))) {
        fprintf(stderr, "metrale-gpu run: creating a stream: %s\n", mg_last_error());
        rc = 1;
        goto done;
    }
    mg_fwd_info info;
    mg_fwd_get_info(m, &info);
    if (!opts->json)
        printf("metrale-gpu run: %s (%u layers, hidden %u, %u/%u heads of %u, vocab %u, %s "
               "weights, %.1f MB) on %s, loaded in %.3f s (%.2f GB/s); %u prompt tokens, %u %s\n",
               p->name, p->layers, p->shape.hidden, p->shape.heads, p->shape.kv_heads,
               p->shape.head_dim, vocab, mg_fwd_weights_name(w), info.weight_bytes / 1e6,
               mg_backend_kind_name(mg_backend_get_kind(b)), load_s,
               load_s > 0 ? info.weight_bytes / load_s / 1e9 : 0.0, a.prompt_count, steps,
               a.teacher ? "teacher-forced steps" : "greedy steps");
    double prefill_s = 0, decode_s = 0;
    for (uint32_t i = 0; i <= steps; i++) {
        t0 = mg_bench_now_us();
        /* teacher forcing: the step's input is the given id, not the prediction (which
         * `predicted` keeps for the output) */
        if (i && a.teacher) {
            uint32_t have;
            predicted[i - 1] = mg_fwd_tokens(m, 0, &have)[have - 1];
            if ((st = mg_fwd_force_tokens(m, &a.teacher[i - 1]))) {
                fprintf(stderr, "metrale-gpu run: %s\n", mg_fwd_error());
                rc = 1;
                goto done;
            }
        }
        st = i == 0 ? mg_fwd_prefill(m, s) : mg_fwd_decode(m, s);
        const double dt = (mg_bench_now_us() - t0) * 1e-6;
        if (st) {
            fprintf(stderr, "metrale-gpu run: %s %u: %s\n", i ? "decode step" : "prefill", i,
                    mg_fwd_error());
            rc = 1;
            goto done;
        }
        *(i ? &decode_s : &prefill_s) += dt;
        if (k) {
            if ((st = mg_fwd_logits(m, logits))) {
                fprintf(stderr, "metrale-gpu run: %s\n", mg_fwd_error());
                rc = 1;
                goto done;
            }
            top_k(logits, vocab, k, top_ids + (size_t)i * k, top_values + (size_t)i * k);
        }
    }
    mg_fwd_get_info(m, &info);
    uint32_t count = 0;
    const int32_t *gen = mg_fwd_tokens(m, 0, &count);
    if (a.teacher) { /* the forced entries of the history: back to the predictions */
        uint32_t have;
        predicted[steps] = mg_fwd_tokens(m, 0, &have)[have - 1];
        gen = predicted;
    }
    mg_bench bench = {.backend = b, .opts = opts, .warmup = 3, .iters = on_cpu ? 5 : 20};
    double gbps = 0;
    bench.stream = s;
    if (mg_bench_copy_bandwidth(&bench, on_cpu ? (64u << 20) : (1u << 30), &gbps))
        fprintf(stderr, "metrale-gpu run: measuring the copy bandwidth failed: %s\n",
                mg_last_error());
    const double step_ms = steps ? decode_s * 1e3 / steps : 0;
    const double step_bytes = (double)info.decode_weight_bytes + (double)info.decode_kv_bytes;
    const double limit_ms = gbps > 0 ? step_bytes / (gbps * 1e6) : 0;
    if (opts->json) {
        printf("{\"model\": \"%s\", \"backend\": \"%s\", \"weights\": \"%s\", \"layers\": %u, "
               "\"hidden\": %u, \"vocab\": %u, \"weight_bytes\": %llu, \"load_s\": %.4f, "
               "\"graph_steps\": %u, \"prefill_s\": %.6f, \"prefill_tokens_per_s\": %.2f, "
               "\"time_to_first_token_s\": %.6f, \"decode_ms_per_step\": %.4f, "
               "\"decode_tokens_per_s\": %.2f, \"copy_gbps\": %.2f, \"memory_bound_ms\": %.4f, "
               "\"fraction_of_limit\": %.4f, \"prompt_ids\": [",
               p->name, mg_backend_kind_name(mg_backend_get_kind(b)), mg_fwd_weights_name(w),
               p->layers, p->shape.hidden, vocab, (unsigned long long)info.weight_bytes, load_s,
               info.graph_steps, prefill_s,
               prefill_s > 0 ? a.prompt_count / prefill_s : 0.0, prefill_s, step_ms,
               step_ms > 0 ? 1e3 / step_ms : 0.0, gbps, limit_ms,
               step_ms > 0 ? limit_ms / step_ms : 0.0);
        for (uint32_t i = 0; i < a.prompt_count; i++)
            printf("%s%d", i ? ", " : "", a.prompt[i]);
        printf("], \"generated_ids\": [");
        for (uint32_t i = 0; i < count; i++)
            printf("%s%d", i ? ", " : "", gen[i]);
        printf("]");
        if (k) {
            printf(", \"steps\": [");
            for (uint32_t i = 0; i < rows; i++) {
                printf("%s{\"id\": %d, \"top\": [", i ? ", " : "", gen[i]);
                for (uint32_t j = 0; j < k; j++)
                    printf("%s[%d, %.9g]", j ? ", " : "", top_ids[(size_t)i * k + j],
                           (double)top_values[(size_t)i * k + j]);
                printf("]}");
            }
            printf("]");
        }
        printf("}\n");
    } else {
        printf("generated ids  ");
        for (uint32_t i = 0; i < count; i++)
            printf("%s%d", i ? " " : "", gen[i]);
        printf("\nsummary:\n");
        printf("  prefill       %.1f tokens/s (%u tokens in %.3f s; time to first token)\n",
               prefill_s > 0 ? a.prompt_count / prefill_s : 0.0, a.prompt_count, prefill_s);
        printf("  decode        %.3f ms/step, %.1f tokens/s (%s)\n", step_ms,
               step_ms > 0 ? 1e3 / step_ms : 0.0,
               info.graph_steps ? "graph replays after the first step" : "eager steps");
        printf("  memory bound  %.3f ms/step: %.1f MB of weights + KV read per step at %.1f GB/s "
               "copy bandwidth; %.1f%% reached\n",
               limit_ms, step_bytes / 1e6, gbps, step_ms > 0 ? 100 * limit_ms / step_ms : 0.0);
    }
done:
    if (s)
        mg_stream_destroy(s);
    mg_fwd_destroy(m);
    mg_backend_close(b);
    free(logits);
    free(top_values);
    free(top_ids);
    free(predicted);
    free(a.prompt);
    free(a.teacher);
    return rc;
}
