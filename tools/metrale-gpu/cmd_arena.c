/* cmd_arena.c - `metrale-gpu arena`: prints the arena plan of a model preset, as the forward
 * model plans it (mg_fwd_plan_for_config: the one table of src/model/model_plan.c) for a run of
 * the given batch, prompt length, steps and weights on the backend the options name. */
#include "commands.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "metrale/arena.h"
#include "model.h"

static void print_usage(FILE *f) {
    fprintf(f, "usage: metrale-gpu arena --list\n"
               "       metrale-gpu arena <preset> [--weights bf16|fp8|nvfp4|mlx8|mlx4] [--fp8]\n"
               "                         [--batch N] [--prompt-len N] [--steps N]\n"
               "                         [--max-chunk-bytes N]\n");
}

static void print_presets(const mg_cli_options *opts) {
    size_t n;
    const mg_fwd_preset *p = mg_fwd_presets(&n);
    if (opts->json) {
        printf("{\"presets\": [");
        for (size_t i = 0; i < n; i++)
            printf("%s{\"name\": \"%s\", \"description\": \"%s\"}", i ? ", " : "", p[i].name,
                   p[i].description);
        printf("]}\n");
        return;
    }
    for (size_t i = 0; i < n; i++)
        printf("%-16s %s\n", p[i].name, p[i].description);
}

static void print_header_text(const mg_fwd_config *c) {
    const mg_fwd_preset *p = c->preset;
    const mg_model_shape *s = &p->shape;
    printf("preset %s: %s\n", p->name, p->description);
    printf("shape: hidden %u, heads %u, kv heads %u, head dim %u, intermediate %u, experts %u, "
           "top-k %u, vocab %u\n",
           s->hidden, s->heads, s->kv_heads, s->head_dim, s->intermediate, s->experts,
           s->experts_per_token, s->vocab);
    printf("run: %s weights, batch %u, prompt length about %u, %u steps\n",
           mg_fwd_weights_name(c->weights), c->batch, c->prompt_len, c->steps);
    printf("steps:");
    for (uint32_t i = 0; mg_fwd_plan_step_name(i, s->experts != 0); i++)
        printf("%s %u %s", i ? "," : "", i, mg_fwd_plan_step_name(i, s->experts != 0));
    printf("\n");
}

static mg_status print_json(const mg_fwd_preset *p, mg_arena_plan *plan) {
    mg_arena_summary sum;
    mg_status st = mg_arena_plan_summary(plan, &sum);
    if (st != MG_OK)
        return st;
    printf("{\"preset\": \"%s\", \"buffers\": [", p->name);
    for (size_t i = 0; i < sum.buffer_count; i++) {
        mg_arena_buffer_info info;
        st = mg_arena_plan_buffer(plan, i, &info);
        if (st != MG_OK)
            return st;
        printf("%s\n  {\"name\": \"%s\", \"bytes\": %" PRIu64 ", \"alignment\": %" PRIu64
               ", \"first_step\": %ld, \"last_step\": %ld, \"chunk\": %u, \"offset\": %" PRIu64 "}",
               i ? "," : "", info.name, info.bytes, info.alignment,
               info.has_lifetime ? (long)info.lifetime.first_step : -1L,
               info.has_lifetime ? (long)info.lifetime.last_step : -1L, info.chunk, info.offset);
    }
    printf("],\n \"sum_bytes\": %" PRIu64 ", \"arena_bytes\": %" PRIu64
           ", \"peak_live_bytes\": %" PRIu64 ", \"device_bytes\": %" PRIu64
           ", \"chunks\": %u, \"packed_over_unpacked\": %.6f}\n",
           sum.sum_bytes, sum.arena_bytes, sum.peak_live_bytes, sum.device_bytes, sum.chunk_count,
           sum.sum_bytes ? (double)sum.arena_bytes / (double)sum.sum_bytes : 1.0);
    return MG_OK;
}

/* A count option's value: false (after a message) when it is not a number. */
static bool parse_count(const char *flag, const char *text, uint64_t *out) {
    char *end;
    *out = strtoull(text, &end, 0);
    if (*end || text[0] == '-' || !text[0]) {
        fprintf(stderr, "arena: %s takes a count, not '%s'\n", flag, text);
        return false;
    }
    return true;
}

int mg_cmd_arena(int argc, char **argv, const mg_cli_options *opts) {
    const char *preset_name = NULL, *weights = "bf16";
    uint64_t max_chunk_bytes = 0, batch = 0, prompt_len = 0, steps = 0;
    bool have_batch = false, have_len = false, have_steps = false;
    for (int i = 1; i < argc; i++) {
        const bool value = i + 1 < argc;
        if (strcmp(argv[i], "--list") == 0) {
            print_presets(opts);
            return 0;
        } else if (strcmp(argv[i], "--fp8") == 0) {
            weights = "fp8";
        } else if (strcmp(argv[i], "--weights") == 0 && value) {
            weights = argv[++i];
        } else if (strcmp(argv[i], "--max-chunk-bytes") == 0 && value) {
            if (!parse_count(argv[i], argv[i + 1], &max_chunk_bytes))
                return 2;
            i++;
        } else if (strcmp(argv[i], "--batch") == 0 && value) {
            if (!(have_batch = parse_count(argv[i], argv[i + 1], &batch)))
                return 2;
            i++;
        } else if (strcmp(argv[i], "--prompt-len") == 0 && value) {
            if (!(have_len = parse_count(argv[i], argv[i + 1], &prompt_len)))
                return 2;
            i++;
        } else if (strcmp(argv[i], "--steps") == 0 && value) {
            if (!(have_steps = parse_count(argv[i], argv[i + 1], &steps)))
                return 2;
            i++;
        } else if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            print_usage(stdout);
            return 0;
        } else if (argv[i][0] != '-' && !preset_name) {
            preset_name = argv[i];
        } else {
            fprintf(stderr, "arena: unexpected argument '%s'\n", argv[i]);
            print_usage(stderr);
            return 2;
        }
    }
    if (!preset_name) {
        print_usage(stderr);
        return 2;
    }
    const mg_fwd_preset *preset = mg_fwd_preset_find(preset_name);
    if (!preset) {
        fprintf(stderr, "arena: no preset named '%s'; presets:\n", preset_name);
        size_t n;
        const mg_fwd_preset *p = mg_fwd_presets(&n);
        for (size_t i = 0; i < n; i++)
            fprintf(stderr, "  %s\n", p[i].name);
        return 2;
    }
    const int w = mg_fwd_weights_find(weights);
    if (w < 0) {
        fprintf(stderr, "arena: unknown weight format '%s'\n", weights);
        return 2;
    }
    mg_fwd_config c = mg_fwd_config_default(preset);
    c.weights = (mg_fwd_weights)w;
    if (have_batch)
        c.batch = batch > UINT32_MAX ? UINT32_MAX : (uint32_t)batch;
    if (have_len)
        c.prompt_len = prompt_len > UINT32_MAX ? UINT32_MAX : (uint32_t)prompt_len;
    if (have_steps)
        c.steps = steps > UINT32_MAX ? UINT32_MAX : (uint32_t)steps;
    mg_backend *b = NULL;
    mg_arena_plan *plan = NULL;
    mg_status st = mg_cli_backend_open(opts, &b);
    if (st == MG_OK)
        st = mg_fwd_plan_for_config(b, &c, &plan);
    if (st == MG_OK)
        st = mg_arena_plan_set_max_chunk_bytes(plan, max_chunk_bytes);
    if (st == MG_OK) {
        if (opts->json) {
            st = print_json(preset, plan);
        } else {
            print_header_text(&c);
            st = mg_arena_plan_print(plan, stdout);
        }
    }
    mg_arena_plan_destroy(plan);
    if (st != MG_OK)
        fprintf(stderr, "arena: %s: %s\n", mg_status_name(st), mg_last_error());
    if (b)
        mg_backend_close(b);
    return st != MG_OK;
}
