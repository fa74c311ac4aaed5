/* cmd_run_model.c - `metrale-gpu run --model PATH`: a real checkpoint through the forward pass
 * (src/model/model.h with config.model_path): load, one prefill of the given prompt, then
 * greedy or sampled decode steps (--temperature ...: mg_fwd_set_sampling) or, with
 * --teacher-force, steps fed a given continuation; prints the ids
 * and the speed against the memory-bound limit, and with --top-logits K each step's K largest
 * logits (for teacher-forced comparisons with independent implementations). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "commands.h"
#include "model.h"
#include "text_gguf.h"

#define MAX_IDS (1u << 16)

typedef struct model_args {
    const char *model;
    const char *text, *chat; /* --prompt, --chat */
    int32_t *prompt, *teacher;
    uint32_t prompt_count, teacher_count;
    long steps, top_logits;
    bool max_tokens; /* --max-tokens: the step count, stopping at the end-of-sequence token */
    /* --temperature --top-k --top-p --min-p --seed --repeat-penalty --repeat-last-n */
    mg_sample_params sampling;
    long repeat_last_n;
    bool unfused; /* --no-fusion */
    long tp;      /* --tp: devices the model is split over (model.h mg_fwd_create_tp) */
} model_args;

static void model_usage(FILE *f) {
    fprintf(
        f, "usage: metrale-gpu [--backend B] [--json] run --model FILE.gguf (--chat TEXT | "
           "--prompt TEXT | --prompt-ids IDS) [--max-tokens N | --steps N | --teacher-force "
           "IDS] [--top-logits K] [--temperature T] [--top-k K] [--top-p P] [--min-p P] [--seed S] "
           "[--repeat-penalty R] [--repeat-last-n N] [--no-fusion] [--tp N]\n"
           "Runs the checkpoint's network (GGUF: llama architecture; Q4_0/Q4_1/Q8_0 matrices on "
           "the MLX kernels, F16/BF16/F32 as BF16) with greedy decoding:\n"
           "--chat TEXT: one user message in the checkpoint's chat template; --prompt TEXT: the "
           "text as it is (special tokens written in it are recognised); --prompt-ids IDS: "
           "comma-separated token ids.\n"
           "--max-tokens N: up to N new tokens, ending at the end-of-sequence token (default "
           "128 for text, streamed as it is generated); --steps N: exactly N decode steps "
           "(default 32 with --prompt-ids); --teacher-force IDS: one step per id, each fed that "
           "id instead of the prediction.\n"
           "--top-logits K adds each step's K largest logits (--json: \"steps\": [{\"id\", "
           "\"top\": [[id, logit], ...]}]).\n"
           "Sampling (metrale/ops_sample.h; default greedy): --temperature T (0: greedy), "
           "--top-k K (0: off), --top-p P (1: off), --min-p P (0: off), --seed S (default 0; the "
           "same seed gives the same text), --repeat-penalty R (1: off) over the last "
           "--repeat-last-n N tokens (default 64, the prompt included).\n"
           "--no-fusion: decode with the norms, residual adds and SiLU-mul as ops of their own "
           "(by default BF16 models fold them into the GEMMs where the backend can).\n"
           "--tp N: split the model over N devices of the backend (tensor parallelism: devices "
           "--device .. --device + N - 1; N CPU devices on the CPU backend); N must divide the "
           "checkpoint's KV heads and intermediate size.\n");
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

static bool parse_float(const char *flag, const char *v, float *out) {
    char *end = NULL;
    float x = v ? strtof(v, &end) : 0.0f;
    if (!v || !*v || *end || x != x) {
        fprintf(stderr, "metrale-gpu run: %s needs a number\n", flag);
        return false;
    }
    *out = x;
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
        } else if (!strcmp(arg, "--prompt") || !strcmp(arg, "--chat")) {
            ok = v != NULL;
            *(arg[2] == 'p' ? &a->text : &a->chat) = v;
            if (!ok)
                fprintf(stderr, "metrale-gpu run: %s needs a text\n", arg);
        } else if (!strcmp(arg, "--max-tokens")) {
            ok = parse_long(arg, v, 1l << 20, &a->steps);
            a->max_tokens = true;
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
        } else if (!strcmp(arg, "--temperature")) {
            ok = parse_float(arg, v, &a->sampling.temperature);
        } else if (!strcmp(arg, "--top-p")) {
            ok = parse_float(arg, v, &a->sampling.top_p);
        } else if (!strcmp(arg, "--min-p")) {
            ok = parse_float(arg, v, &a->sampling.min_p);
        } else if (!strcmp(arg, "--repeat-penalty")) {
            ok = parse_float(arg, v, &a->sampling.repetition_penalty);
        } else if (!strcmp(arg, "--top-k")) {
            long k = 0;
            ok = parse_long(arg, v, INT32_MAX, &k);
            a->sampling.top_k = (uint32_t)k;
        } else if (!strcmp(arg, "--repeat-last-n")) {
            ok = parse_long(arg, v, MG_SAMPLE_MAX_HISTORY, &a->repeat_last_n);
        } else if (!strcmp(arg, "--seed")) {
            char *end = NULL;
            errno = 0;
            a->sampling.seed = v ? strtoull(v, &end, 0) : 0;
            ok = v && *v && *v != '-' && !*end && !errno;
            if (!ok)
                fprintf(stderr, "metrale-gpu run: --seed needs an integer from 0 to 2^64 - 1\n");
        } else if (!strcmp(arg, "--tp")) {
            ok = mg_cli_parse_tp(v, &a->tp);
            if (!ok)
                fprintf(stderr, "metrale-gpu run: --tp needs %s\n", mg_cli_tp_accepted());
        } else if (!strcmp(arg, "--no-fusion")) {
            a->unfused = true;
            continue; /* takes no value */
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
    if (!a->model) {
        fprintf(stderr, "metrale-gpu run: --model needs a path\n");
        return 2;
    }
    if (!!a->prompt + !!a->text + !!a->chat != 1) {
        fprintf(stderr, "metrale-gpu run: --model needs one of --chat, --prompt and "
                        "--prompt-ids\n");
        return 2;
    }
    if (mg_sample_params_check(&a->sampling, 1, 0)) {
        fprintf(stderr, "metrale-gpu run: %s\n", mg_last_error());
        return 2;
    }
    if (a->teacher && a->steps >= 0) {
        fprintf(stderr, "metrale-gpu run: --steps / --max-tokens and --teacher-force exclude "
                        "each other\n");
        return 2;
    }
    return 0;
}

/* s as a JSON string (control characters escaped; s is valid UTF-8, as decode makes it). */
static void print_json_string(const char *s, size_t n) {
    putchar('"');
    for (size_t i = 0; i < n; i++) {
        const unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\')
            printf("\\%c", c);
        else if (c == '\n')
            printf("\\n");
        else if (c < 0x20)
            printf("\\u%04x", c);
        else
            putchar(c);
    }
    putchar('"');
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
    model_args a = {.steps = -1, .sampling = mg_sample_params_greedy(), .repeat_last_n = 64};
    int rc = parse_model_args(argc, argv, &a);
    if (rc) {
        free(a.prompt);
        free(a.teacher);
        return rc < 0 ? 0 : rc;
    }
    mg_tok *tok = NULL;
    mg_tok_stream *stream = NULL;
    int32_t eos = -1;
    if (a.text || a.chat) {
        mg_chat_template chat;
        bool has_chat;
        char problem[512];
        if (mg_gguf_text_open(a.model, &tok, &chat, &has_chat, problem, sizeof problem)) {
            fprintf(stderr, "metrale-gpu run: %s\n", mg_last_error());
            free(a.teacher);
            return 1;
        }
        char *rendered = NULL;
        const char *text = a.text;
        size_t len = 0, n = 0;
        if (a.chat) {
            const mg_chat_message msg = {.role = "user", .content = a.chat};
            if (!has_chat) {
                fprintf(stderr,
                        "metrale-gpu run: --chat: %s; give the text as it is with "
                        "--prompt\n",
                        problem);
                mg_tok_destroy(tok);
                free(a.teacher);
                return 2;
            }
            mg_chat_render(&chat, &msg, 1, true, NULL, 0, &len);
            if (!(rendered = malloc(len + 1)) ||
                mg_chat_render(&chat, &msg, 1, true, rendered, len + 1, &len)) {
                fprintf(stderr, "metrale-gpu run: rendering the chat: %s\n",
                        rendered ? mg_last_error() : "out of host memory");
                free(rendered);
                mg_tok_destroy(tok);
                free(a.teacher);
                return 1;
            }
            text = rendered;
        }
        len = strlen(text);
        /* a template that writes BOS itself (Llama-3, Mistral) must not get a second one */
        const bool add_special = !(a.chat && mg_chat_writes_bos(&chat, 1));
        mg_status te = mg_tok_encode(tok, text, len, add_special, true, NULL, 0, &n);
        if (te == MG_OK || n > 0) {
            if (!(a.prompt = malloc((n ? n : 1) * sizeof *a.prompt)))
                te = MG_ERR_OUT_OF_MEMORY;
            else
                te = mg_tok_encode(tok, text, len, add_special, true, a.prompt, n, &n);
        }
        free(rendered);
        if (te || n == 0) {
            fprintf(stderr, "metrale-gpu run: %s: %s\n", a.chat ? "--chat" : "--prompt",
                    te ? mg_tok_error() : "the text has no tokens: give a non-empty prompt");
            mg_tok_destroy(tok);
            free(a.prompt);
            free(a.teacher);
            return 2;
        }
        a.prompt_count = (uint32_t)n;
        eos = mg_tok_eos(tok);
        if (!a.teacher && a.steps < 0) {
            a.steps = 128;
            a.max_tokens = true;
        }
        if (!opts->json && mg_tok_stream_create(tok, true, &stream)) {
            fprintf(stderr, "metrale-gpu run: %s\n", mg_tok_error());
            mg_tok_destroy(tok);
            free(a.prompt);
            free(a.teacher);
            return 1;
        }
    }
    if (a.max_tokens && a.steps == 0) {
        fprintf(stderr, "metrale-gpu run: --max-tokens must be at least 1\n");
        mg_tok_stream_destroy(stream);
        mg_tok_destroy(tok);
        free(a.prompt);
        free(a.teacher);
        return 2;
    }
    /* --max-tokens N: the prefill makes the first token, N - 1 decode steps the rest */
    const uint32_t steps = a.teacher      ? a.teacher_count
                           : a.max_tokens ? (uint32_t)a.steps - 1
                           : a.steps >= 0 ? (uint32_t)a.steps
                                          : 32;
    mg_backend *ranks[MG_COMM_MAX_RANKS] = {NULL};
    const int tp = a.tp > 0 ? (int)a.tp : 1;
    mg_status st = mg_cli_backends_open(opts, tp, ranks);
    mg_backend *b = ranks[0];
    if (st) {
        mg_tok_stream_destroy(stream);
        mg_tok_destroy(tok);
        free(a.prompt);
        free(a.teacher);
        return 1;
    }
    const bool on_cpu = mg_backend_get_kind(b) == MG_BACKEND_CPU;
    mg_fwd_config c = {.batch = 1,
                       .steps = steps,
                       .seed = 1,
                       .use_graphs = !on_cpu,
                       .model_path = a.model,
                       .prompt_ids = a.prompt,
                       .prompt_ids_count = a.prompt_count,
                       .unfused = a.unfused};
    mg_fwd *m = NULL;
    mg_stream *s = NULL;
    const uint32_t k = (uint32_t)a.top_logits;
    float *logits = NULL, *top_values = NULL;
    int32_t *top_ids = NULL;
    int32_t *predicted = calloc(steps + 1, sizeof *predicted); /* teacher forcing's greedy ids */
    double t0 = mg_bench_now_us();
    if ((st = mg_fwd_create_tp(ranks, tp, &c, &m))) {
        fprintf(stderr, "metrale-gpu run: %s\n", mg_last_error());
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
        fprintf(stderr, "metrale-gpu run: --top-logits %u exceeds the vocabulary (%u)\n", k, vocab);
        rc = 2;
        goto done;
    }
    /* sampled decoding only when asked for: greedy stays the argmax op */
    const bool sampled = a.sampling.temperature > 0 || a.sampling.repetition_penalty != 1.0f;
    if (sampled && mg_fwd_set_sampling(m, &a.sampling, (uint32_t)a.repeat_last_n)) {
        fprintf(stderr, "metrale-gpu run: %s\n", mg_last_error());
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
               a.teacher      ? "teacher-forced steps"
               : a.max_tokens ? "decode steps at most"
                              : "greedy steps");
    if (!opts->json && sampled)
        printf("sampling: temperature %g, top-k %u, top-p %g, min-p %g, repeat penalty %g over "
               "%ld tokens, seed %llu\n",
               a.sampling.temperature, a.sampling.top_k, a.sampling.top_p, a.sampling.min_p,
               a.sampling.repetition_penalty, a.repeat_last_n, (unsigned long long)a.sampling.seed);
    uint32_t done_steps = 0; /* decode steps run (fewer than `steps` when EOS ends the text) */
    double prefill_s = 0, decode_s = 0;
    for (uint32_t i = 0; i <= steps; i++) {
        t0 = mg_bench_now_us();
        /* teacher forcing: the step's input is the given id, not the prediction (which
         * `predicted` keeps for the output) */
        if (i && a.teacher) {
            uint32_t have;
            predicted[i - 1] = mg_fwd_tokens(m, 0, &have)[have - 1];
            if ((st = mg_fwd_force_tokens(m, &a.teacher[i - 1]))) {
                fprintf(stderr, "metrale-gpu run: %s\n", mg_last_error());
                rc = 1;
                goto done;
            }
        }
        st = i == 0 ? mg_fwd_prefill(m, s) : mg_fwd_decode(m, s);
        const double dt = (mg_bench_now_us() - t0) * 1e-6;
        if (st) {
            fprintf(stderr, "metrale-gpu run: %s %u: %s\n", i ? "decode step" : "prefill", i,
                    mg_last_error());
            rc = 1;
            goto done;
        }
        *(i ? &decode_s : &prefill_s) += dt;
        done_steps = i;
        uint32_t have;
        const int32_t latest = mg_fwd_tokens(m, 0, &have)[have - 1];
        if (stream) { /* the text so far, as soon as it is whole UTF-8 */
            char piece[1024];
            size_t plen = 0;
            if (!mg_tok_stream_put(stream, latest, piece, sizeof piece, &plen))
                fputs(piece, stdout);
            fflush(stdout);
        }
        if (k) {
            if ((st = mg_fwd_logits(m, logits))) {
                fprintf(stderr, "metrale-gpu run: %s\n", mg_last_error());
                rc = 1;
                goto done;
            }
            top_k(logits, vocab, k, top_ids + (size_t)i * k, top_values + (size_t)i * k);
        }
        if (a.max_tokens && latest == eos)
            break;
    }
    if (stream) {
        char rest[64];
        size_t rlen = 0;
        if (!mg_tok_stream_finish(stream, rest, sizeof rest, &rlen))
            fputs(rest, stdout);
        fputs("\n", stdout);
    }
    mg_fwd_get_info(m, &info);
    uint32_t count = 0;
    const int32_t *gen = mg_fwd_tokens(m, 0, &count);
    count = done_steps + 1 < count ? done_steps + 1 : count;
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
    const double step_ms = done_steps ? decode_s * 1e3 / done_steps : 0;
    const double step_bytes = (double)info.decode_weight_bytes + (double)info.decode_kv_bytes;
    const double limit_ms = gbps > 0 ? step_bytes / (gbps * 1e6) : 0;
    if (opts->json) {
        printf("{\"model\": \"%s\", \"backend\": \"%s\", \"weights\": \"%s\", \"layers\": %u, "
               "\"hidden\": %u, \"vocab\": %u, \"weight_bytes\": %llu, \"load_s\": %.4f, "
               "\"graph_steps\": %u, \"kernels_per_step\": %u, \"graph_nodes_per_step\": %u, "
               "\"kernels_per_layer\": %u, \"kernels_outside_layers\": %u, \"fused_decode\": %s, "
               "\"fused_qkv\": %s, \"fused_kv_append\": %s, "
               "\"prefill_s\": %.6f, \"prefill_tokens_per_s\": %.2f, "
               "\"time_to_first_token_s\": %.6f, \"decode_ms_per_step\": %.4f, "
               "\"decode_tokens_per_s\": %.2f, \"copy_gbps\": %.2f, \"memory_bound_ms\": %.4f, "
               "\"fraction_of_limit\": %.4f, \"prompt_ids\": [",
               p->name, mg_backend_kind_name(mg_backend_get_kind(b)), mg_fwd_weights_name(w),
               p->layers, p->shape.hidden, vocab, (unsigned long long)info.weight_bytes, load_s,
               info.graph_steps, info.graph_kernels, info.graph_nodes, info.graph_layer_kernels,
               info.graph_outside_kernels, info.fused_decode ? "true" : "false",
               info.fused_qkv ? "true" : "false", info.fused_kv_append ? "true" : "false",
               prefill_s, prefill_s > 0 ? a.prompt_count / prefill_s : 0.0, prefill_s, step_ms,
               step_ms > 0 ? 1e3 / step_ms : 0.0, gbps, limit_ms,
               step_ms > 0 ? limit_ms / step_ms : 0.0);
        for (uint32_t i = 0; i < a.prompt_count; i++)
            printf("%s%d", i ? ", " : "", a.prompt[i]);
        printf("], \"generated_ids\": [");
        for (uint32_t i = 0; i < count; i++)
            printf("%s%d", i ? ", " : "", gen[i]);
        printf("]");
        if (tok) {
            size_t tl = 0;
            mg_tok_decode(tok, gen, count, true, NULL, 0, &tl);
            char *text = malloc(tl + 1);
            if (text && !mg_tok_decode(tok, gen, count, true, text, tl + 1, &tl)) {
                printf(", \"text\": ");
                print_json_string(text, tl);
            }
            free(text);
        }
        if (k) {
            printf(", \"steps\": [");
            for (uint32_t i = 0; i < count && i < rows; i++) {
                printf("%s{\"id\": %d, \"top\": [", i ? ", " : "", gen[i]);
                for (uint32_t j = 0; j < k; j++)
                    printf("%s[%d, %.9g]", j ? ", " : "", top_ids[(size_t)i * k + j],
                           (double)top_values[(size_t)i * k + j]);
                printf("]}");
            }
            printf("]");
        }
        printf("}\n");
    } else if (!stream) {
        printf("generated ids  ");
        for (uint32_t i = 0; i < count; i++)
            printf("%s%d", i ? " " : "", gen[i]);
        printf("\n");
    }
    if (!opts->json) {
        printf("summary:\n");
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
    mg_cli_backends_close(ranks, tp);
    free(logits);
    free(top_values);
    free(top_ids);
    free(predicted);
    mg_tok_stream_destroy(stream);
    mg_tok_destroy(tok);
    free(a.prompt);
    free(a.teacher);
    return rc;
}
