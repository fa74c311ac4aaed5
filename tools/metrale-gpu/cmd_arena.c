/* cmd_arena.c - `metrale-gpu arena`: prints the arena plan of a model preset. */
#include "commands.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "metrale/arena.h"

static void print_usage(FILE *f) {
    fprintf(f, "usage: metrale-gpu arena --list\n"
               "       metrale-gpu arena <preset> [--fp8] [--max-chunk-bytes N]\n");
}

static void print_presets(const mg_cli_options *opts) {
    size_t n;
    const mg_model_preset *p = mg_model_presets(&n);
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

static void print_header_text(const mg_model_preset *p, const mg_engine_limits *l,
                              const mg_model_rows *r) {
    const mg_model_shape *s = &p->shape;
    printf("preset %s: %s\n", p->name, p->description);
    printf("shape: hidden %u, heads %u, kv heads %u, head dim %u, intermediate %u, experts %u, "
           "top-k %u, vocab %u\n",
           s->hidden, s->heads, s->kv_heads, s->head_dim, s->intermediate, s->experts,
           s->experts_per_token, s->vocab);
    printf("limits: max batch tokens %u, max seq len %u, kv block %u, max batch size %u, fp8 "
           "activations %s\n",
           l->max_batch_tokens, l->max_seq_len, l->kv_block_size, l->max_batch_size,
           l->fp8_activations ? "yes" : "no");
    printf("rows: tokens %" PRIu64 " (padded %" PRIu64 "), logits %" PRIu64 " (padded %" PRIu64
           "), decode %" PRIu64 ", expert %" PRIu64 ", attention splits %" PRIu64 "\n",
           r->tokens, r->tokens_padded, r->logits_rows, r->logits_rows_padded, r->decode_rows,
           r->expert_rows, r->attn_split_rows);
}

/* The forward-pass steps that lifetimes refer to (mg_model_step). */
static void print_step_legend(bool moe) {
    static const char *const common[] = {"embed",    "attn_norm", "qkv_proj", "rope",
                                         "kv_write", "attention", "o_proj",   "mlp_norm"};
    static const char *const dense[] = {"mlp_gate_up", "mlp_act", "mlp_down"};
    static const char *const experts[] = {"moe_router",  "moe_topk", "moe_align", "moe_permute",
                                          "moe_gate_up", "moe_act",  "moe_down",  "moe_combine"};
    static const char *const head[] = {"logits_gather", "final_norm", "lm_head", "sample"};
    printf("steps:");
    for (int i = 0; i < 8; i++)
        printf(" %d %s,", i, common[i]);
    for (int i = 0; i < (moe ? 8 : 3); i++)
        printf(" %d %s,", MG_STEP_MLP_GATE_UP + i, moe ? experts[i] : dense[i]);
    for (int i = 0; i < 4; i++)
        printf(" %d %s%s", MG_STEP_LOGITS_GATHER + i, head[i], i < 3 ? "," : "\n");
}

static mg_status print_json(const mg_model_preset *p, mg_arena_plan *plan) {
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

int mg_cmd_arena(int argc, char **argv, const mg_cli_options *opts) {
    const char *preset_name = NULL;
    bool fp8 = false;
    uint64_t max_chunk_bytes = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--list") == 0) {
            print_presets(opts);
            return 0;
        } else if (strcmp(argv[i], "--fp8") == 0) {
            fp8 = true;
        } else if (strcmp(argv[i], "--max-chunk-bytes") == 0 && i + 1 < argc) {
            char *end;
            max_chunk_bytes = strtoull(argv[++i], &end, 0);
            if (*end || argv[i][0] == '-') {
                fprintf(stderr, "arena: --max-chunk-bytes takes a byte count, not '%s'\n", argv[i]);
                return 2;
            }
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
    const mg_model_preset *preset = mg_model_preset_find(preset_name);
    if (!preset) {
        fprintf(stderr, "arena: no preset named '%s'; presets:\n", preset_name);
        size_t n;
        const mg_model_preset *p = mg_model_presets(&n);
        for (size_t i = 0; i < n; i++)
            fprintf(stderr, "  %s\n", p[i].name);
        return 2;
    }
    mg_engine_limits limits = preset->limits;
    limits.fp8_activations = limits.fp8_activations || fp8;
    mg_model_rows rows;
    mg_arena_plan *plan = NULL;
    mg_status st = mg_model_rows_compute(&preset->shape, &limits, &rows);
    if (st == MG_OK)
        st = mg_arena_plan_for_model(&preset->shape, &limits, &plan);
    if (st == MG_OK)
        st = mg_arena_plan_set_max_chunk_bytes(plan, max_chunk_bytes);
    if (st == MG_OK) {
        if (opts->json) {
            st = print_json(preset, plan);
        } else {
            print_header_text(preset, &limits, &rows);
            print_step_legend(preset->shape.experts != 0);
            st = mg_arena_plan_print(plan, stdout);
        }
    }
    mg_arena_plan_destroy(plan);
    if (st != MG_OK) {
        fprintf(stderr, "arena: %s: %s\n", mg_status_name(st), mg_last_error());
        return 1;
    }
    return 0;
}
