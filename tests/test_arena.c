/*
 * test_arena.c - the buffer arena (metrale/arena.h).
 *
 * Plans: argument checks, sharing rules on small hand-made cases, and a property test over
 * many random plans (sizes, alignments, lifetimes, chunk limits) proving that no two
 * simultaneously live buffers overlap, every buffer is aligned and inside its chunk, and the
 * reported totals are consistent. The forward model's plan (src/model/model_plan.c) of a
 * preset checked against sizes computed by hand here. Arenas on the CPU backend: real addresses, a
 * memory test that writes every buffer over its lifetime and checks no live neighbour was
 * clobbered, lookups, idempotent release, and out-of-memory injected at each allocation with the
 * ledger back to zero afterwards.
 */
#include <inttypes.h>

#include "metrale/arena.h"
#include "metrale/cpu.h"
#include "model.h"
#include "utils_test_support.h"

/* ------------------------------------------------------------------ plan checks */

static void test_plan_arguments(void) {
    mg_arena_plan *plan = NULL;
    CHECK_OK(mg_arena_plan_create(&plan));
    CHECK_STATUS(mg_arena_plan_create(NULL), MG_ERR_INVALID_ARGUMENT);
    mg_arena_lifetime lt = {3, 5}, backwards = {5, 3};
    size_t index = 99;
    CHECK_OK(mg_arena_plan_add(plan, "a", 100, 0, &lt, &index));
    CHECK(index == 0);
    CHECK_OK(mg_arena_plan_add(plan, "b", 100, 4096, NULL, &index));
    CHECK(index == 1);

    CHECK_STATUS(mg_arena_plan_add(NULL, "x", 1, 0, NULL, NULL), MG_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(mg_arena_plan_add(plan, NULL, 1, 0, NULL, NULL), MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("NULL name");
    CHECK_STATUS(mg_arena_plan_add(plan, "", 1, 0, NULL, NULL), MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("0 characters");
    char long_name[64];
    memset(long_name, 'n', 48);
    long_name[48] = '\0';
    CHECK_STATUS(mg_arena_plan_add(plan, long_name, 1, 0, NULL, NULL), MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("48 characters");
    long_name[47] = '\0'; /* 47 is the longest allowed */
    CHECK_OK(mg_arena_plan_add(plan, long_name, 1, 0, NULL, NULL));
    CHECK_STATUS(mg_arena_plan_add(plan, "c", 1, 3, NULL, NULL), MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("alignment 3");
    CHECK_STATUS(mg_arena_plan_add(plan, "c", 1, 384, NULL, NULL), MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("'c'");
    CHECK_STATUS(mg_arena_plan_add(plan, "c", 1, 1ull << 31, NULL, NULL), MG_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(mg_arena_plan_add(plan, "c", 1, 0, &backwards, NULL), MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("lifetime [5, 3]");
    CHECK_STATUS(mg_arena_plan_add(plan, "a", 1, 0, NULL, NULL), MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("'a' already planned");
    CHECK(mg_arena_plan_count(plan) == 3); /* failed adds changed nothing */

    size_t found = 0;
    CHECK_OK(mg_arena_plan_find(plan, "b", &found));
    CHECK(found == 1);
    CHECK_STATUS(mg_arena_plan_find(plan, "zz", &found), MG_ERR_NOT_FOUND);
    CHECK_MESSAGE("'zz'");
    mg_arena_buffer_info info;
    CHECK_STATUS(mg_arena_plan_buffer(plan, 3, &info), MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("index 3 out of range");
    CHECK_OK(mg_arena_plan_buffer(plan, 0, &info));
    CHECK(strcmp(info.name, "a") == 0 && info.bytes == 100 && info.alignment == 256);
    CHECK(info.has_lifetime && info.lifetime.first_step == 3 && info.lifetime.last_step == 5);
    CHECK(info.ptr == 0);
    CHECK_OK(mg_arena_plan_buffer(plan, 1, &info));
    CHECK(!info.has_lifetime && info.alignment == 4096 && info.offset % 4096 == 0);

    /* sizes whose sum overflows are refused when packing */
    CHECK_OK(mg_arena_plan_add(plan, "huge1", UINT64_MAX / 2 + 1, 0, NULL, NULL));
    CHECK_OK(mg_arena_plan_add(plan, "huge2", UINT64_MAX / 2 + 1, 0, NULL, NULL));
    mg_arena_summary sum;
    CHECK_STATUS(mg_arena_plan_summary(plan, &sum), MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("2^64");
    mg_arena_plan_destroy(plan);
    mg_arena_plan_destroy(NULL);

    /* an empty plan packs to nothing */
    CHECK_OK(mg_arena_plan_create(&plan));
    CHECK_OK(mg_arena_plan_summary(plan, &sum));
    CHECK(sum.buffer_count == 0 && sum.arena_bytes == 0 && sum.chunk_count == 0);
    mg_arena_plan_destroy(plan);
}

static mg_arena_summary summary_of(mg_arena_plan *plan) {
    mg_arena_summary s;
    memset(&s, 0xA5, sizeof s);
    CHECK_OK(mg_arena_plan_summary(plan, &s));
    return s;
}

static mg_arena_buffer_info info_of(mg_arena_plan *plan, size_t i) {
    mg_arena_buffer_info info;
    memset(&info, 0xA5, sizeof info);
    CHECK_OK(mg_arena_plan_buffer(plan, i, &info));
    return info;
}

static void test_sharing_rules(void) {
    mg_arena_plan *plan;
    mg_arena_lifetime s01 = {0, 1}, s23 = {2, 3}, s13 = {1, 3};

    /* disjoint lifetimes share the same bytes */
    CHECK_OK(mg_arena_plan_create(&plan));
    CHECK_OK(mg_arena_plan_add(plan, "a", 1000, 0, &s01, NULL));
    CHECK_OK(mg_arena_plan_add(plan, "b", 1000, 0, &s23, NULL));
    mg_arena_summary s = summary_of(plan);
    CHECK(s.sum_bytes == 2000 && s.arena_bytes == 1000 && s.peak_live_bytes == 1000);
    CHECK(info_of(plan, 0).offset == 0 && info_of(plan, 1).offset == 0);
    /* an overlapping third one cannot sit on either */
    CHECK_OK(mg_arena_plan_add(plan, "c", 10, 0, &s13, NULL));
    s = summary_of(plan);
    CHECK(s.arena_bytes == 1024 + 10 && s.peak_live_bytes == 2010 - 1000);
    CHECK(info_of(plan, 2).offset == 1024);
    mg_arena_plan_destroy(plan);

    /* buffers without lifetimes never share, even with each other */
    CHECK_OK(mg_arena_plan_create(&plan));
    CHECK_OK(mg_arena_plan_add(plan, "x", 256, 0, NULL, NULL));
    CHECK_OK(mg_arena_plan_add(plan, "y", 256, 0, NULL, NULL));
    CHECK_OK(mg_arena_plan_add(plan, "z", 256, 0, &s01, NULL));
    s = summary_of(plan);
    CHECK(s.arena_bytes == 768 && s.sum_bytes == 768);
    mg_arena_plan_destroy(plan);

    /* zero-size buffers occupy nothing and sit at offset 0 */
    CHECK_OK(mg_arena_plan_create(&plan));
    CHECK_OK(mg_arena_plan_add(plan, "empty", 0, 0, NULL, NULL));
    CHECK_OK(mg_arena_plan_add(plan, "one", 1, 0, NULL, NULL));
    CHECK_OK(mg_arena_plan_add(plan, "empty2", 0, 65536, &s01, NULL));
    s = summary_of(plan);
    CHECK(s.arena_bytes == 1 && s.sum_bytes == 1 && s.buffer_count == 3 && s.chunk_count == 1);
    CHECK(info_of(plan, 0).offset == 0 && info_of(plan, 2).offset == 0);
    mg_arena_plan_destroy(plan);

    /* alignment: a 100-byte buffer after another live one starts at 256; a 4 KiB-aligned one
     * at 4096; the device over-allocation accounts for alignments above 256 */
    CHECK_OK(mg_arena_plan_create(&plan));
    CHECK_OK(mg_arena_plan_add(plan, "p", 100, 0, NULL, NULL));
    CHECK_OK(mg_arena_plan_add(plan, "q", 100, 0, NULL, NULL));
    CHECK_OK(mg_arena_plan_add(plan, "r", 100, 4096, NULL, NULL));
    s = summary_of(plan);
    CHECK(s.arena_bytes == 612); /* r at 0, p at 256, q at 512: aligned first wastes nothing */
    CHECK(s.device_bytes == s.arena_bytes + 4096 - 256);
    for (size_t i = 0; i < 3; i++)
        CHECK(info_of(plan, i).offset % info_of(plan, i).alignment == 0);
    mg_arena_plan_destroy(plan);

    /* a chunk limit splits the layout; a buffer above the limit is named */
    CHECK_OK(mg_arena_plan_create(&plan));
    CHECK_OK(mg_arena_plan_add(plan, "big1", 3000, 0, NULL, NULL));
    CHECK_OK(mg_arena_plan_add(plan, "big2", 3000, 0, NULL, NULL));
    CHECK_OK(mg_arena_plan_add(plan, "small", 500, 0, NULL, NULL));
    CHECK_OK(mg_arena_plan_set_max_chunk_bytes(plan, 4000));
    s = summary_of(plan);
    CHECK(s.chunk_count == 2 && s.largest_chunk_bytes <= 4000 &&
          s.arena_bytes == 3072 + 500 + 3000);
    CHECK(info_of(plan, 0).chunk != info_of(plan, 1).chunk);
    CHECK_OK(mg_arena_plan_set_max_chunk_bytes(plan, 2999));
    CHECK_STATUS(mg_arena_plan_pack(plan), MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("'big1' of 3000 bytes exceeds the per-allocation limit of 2999");
    CHECK_OK(mg_arena_plan_set_max_chunk_bytes(plan, 0));
    s = summary_of(plan);
    CHECK(s.chunk_count == 1 && s.arena_bytes == 3072 * 2 + 500);
    mg_arena_plan_destroy(plan);
}

/* ------------------------------------------------------------------ random plans */

#define MAX_RANDOM_BUFFERS 80
#define RANDOM_STEPS 32

typedef struct random_buffer {
    char name[MG_ARENA_NAME_BYTES];
    uint64_t bytes, alignment;
    bool has_lifetime;
    mg_arena_lifetime lt;
} random_buffer;

static bool live_together(const random_buffer *a, const random_buffer *b) {
    uint32_t af = a->has_lifetime ? a->lt.first_step : 0;
    uint32_t al = a->has_lifetime ? a->lt.last_step : UINT32_MAX;
    uint32_t bf = b->has_lifetime ? b->lt.first_step : 0;
    uint32_t bl = b->has_lifetime ? b->lt.last_step : UINT32_MAX;
    return af <= bl && bf <= al;
}

static uint64_t random_size(void) {
    switch (test_rand() % 6) {
    case 0:
        return 0;
    case 1:
        return test_rand_range(1, 300);
    case 2:
        return test_rand_range(1, 5000);
    case 3:
        return test_rand_range(4096, 1 << 20) | 1; /* odd: never a multiple of anything */
    case 4:
        return 256 * test_rand_range(1, 64);
    default:
        return test_rand_range(1, 1 << 16);
    }
}

/* Generates a random plan; `limit_out` receives the chunk limit used (0 = none). */
static size_t make_random_plan(random_buffer *bufs, mg_arena_plan *plan, uint64_t *limit_out) {
    size_t n = (size_t)test_rand_range(1, MAX_RANDOM_BUFFERS);
    uint64_t largest = 0;
    for (size_t i = 0; i < n; i++) {
        random_buffer *r = &bufs[i];
        snprintf(r->name, sizeof r->name, "buf%zu", i);
        r->bytes = random_size();
        uint64_t a = test_rand() % 5;
        r->alignment = a == 0 ? 0 : 1ull << test_rand_range(0, a == 1 ? 16 : 9);
        r->has_lifetime = test_rand() % 5 != 0;
        uint32_t f = (uint32_t)test_rand_range(0, RANDOM_STEPS - 1);
        uint32_t len = (uint32_t)(test_rand() % 3 ? test_rand_range(0, 3) : test_rand_range(0, 20));
        r->lt = (mg_arena_lifetime){f, f + len < RANDOM_STEPS ? f + len : RANDOM_STEPS - 1};
        CHECK_OK(mg_arena_plan_add(plan, r->name, r->bytes, r->alignment,
                                   r->has_lifetime ? &r->lt : NULL, NULL));
        if (r->alignment == 0)
            r->alignment = 256;
        if (r->bytes > largest)
            largest = r->bytes;
    }
    *limit_out = 0;
    if (test_rand() % 3 == 0 && largest > 0)
        *limit_out = largest + test_rand_range(0, largest * 2);
    CHECK_OK(mg_arena_plan_set_max_chunk_bytes(plan, *limit_out));
    return n;
}

/* Checks one packed plan against the rules; returns false on the first broken rule so a
 * bad layout does not flood the log. */
static bool check_layout(const random_buffer *bufs, size_t n, mg_arena_plan *plan, uint64_t limit) {
    static mg_arena_buffer_info info[MAX_RANDOM_BUFFERS];
    mg_arena_summary s = summary_of(plan);
    uint64_t sum = 0, slack_bound = 0;
    for (size_t i = 0; i < n; i++) {
        info[i] = info_of(plan, i);
        sum += bufs[i].bytes;
        slack_bound += bufs[i].bytes ? bufs[i].bytes + bufs[i].alignment - 1 : 0;
        CHECK(info[i].bytes == bufs[i].bytes && info[i].alignment == bufs[i].alignment);
        CHECKF(info[i].offset % bufs[i].alignment == 0, "%s offset %" PRIu64 " alignment %" PRIu64,
               bufs[i].name, info[i].offset, bufs[i].alignment);
        if (bufs[i].bytes == 0)
            CHECK(info[i].offset == 0 && info[i].chunk == 0);
        else
            CHECKF(info[i].chunk < s.chunk_count, "%s in chunk %u of %u", bufs[i].name,
                   info[i].chunk, s.chunk_count);
        if (limit && bufs[i].bytes)
            CHECKF(info[i].offset + bufs[i].bytes <= limit, "%s ends past the chunk limit",
                   bufs[i].name);
    }
    CHECK(s.buffer_count == n && s.sum_bytes == sum);
    /* chunk sizes: the highest end in each chunk; they add up to arena_bytes */
    uint64_t chunk_end[MAX_RANDOM_BUFFERS] = {0}, total = 0;
    for (size_t i = 0; i < n; i++)
        if (bufs[i].bytes && info[i].chunk < MAX_RANDOM_BUFFERS &&
            info[i].offset + bufs[i].bytes > chunk_end[info[i].chunk])
            chunk_end[info[i].chunk] = info[i].offset + bufs[i].bytes;
    uint64_t largest = 0;
    for (uint32_t c = 0; c < s.chunk_count && c < MAX_RANDOM_BUFFERS; c++) {
        CHECKF(chunk_end[c] > 0, "chunk %u is empty", c);
        total += chunk_end[c];
        if (chunk_end[c] > largest)
            largest = chunk_end[c];
    }
    CHECKF(total == s.arena_bytes, "chunks add to %" PRIu64 ", arena_bytes %" PRIu64, total,
           s.arena_bytes);
    CHECK(largest == s.largest_chunk_bytes);
    /* never two simultaneously live buffers on the same bytes */
    for (size_t i = 0; i < n; i++)
        for (size_t j = i + 1; j < n; j++) {
            if (!bufs[i].bytes || !bufs[j].bytes || info[i].chunk != info[j].chunk ||
                !live_together(&bufs[i], &bufs[j]))
                continue;
            bool disjoint = info[i].offset + bufs[i].bytes <= info[j].offset ||
                            info[j].offset + bufs[j].bytes <= info[i].offset;
            CHECKF(disjoint,
                   "%s [%" PRIu64 ", +%" PRIu64 ") and %s [%" PRIu64 ", +%" PRIu64
                   ") overlap while both live",
                   bufs[i].name, info[i].offset, bufs[i].bytes, bufs[j].name, info[j].offset,
                   bufs[j].bytes);
            if (!disjoint)
                return false;
        }
    /* peak live by brute force over the steps (always-live buffers count at every step) */
    uint64_t peak = 0;
    for (uint32_t step = 0; step < RANDOM_STEPS; step++) {
        uint64_t live = 0;
        for (size_t i = 0; i < n; i++)
            if (!bufs[i].has_lifetime ||
                (bufs[i].lt.first_step <= step && step <= bufs[i].lt.last_step))
                live += bufs[i].bytes;
        if (live > peak)
            peak = live;
    }
    CHECKF(s.peak_live_bytes == peak, "peak %" PRIu64 " want %" PRIu64, s.peak_live_bytes, peak);
    CHECK(s.arena_bytes >= s.peak_live_bytes);
    CHECKF(s.arena_bytes <= slack_bound, "arena %" PRIu64 " above sum + alignment slack %" PRIu64,
           s.arena_bytes, slack_bound);
    if (!limit)
        CHECK(s.chunk_count == (sum ? 1u : 0u));
    return true;
}

static void test_random_plans(void) {
    static random_buffer bufs[MAX_RANDOM_BUFFERS];
    double ratio_sum = 0;
    int ratio_count = 0;
    for (int iter = 0; iter < 1500; iter++) {
        mg_arena_plan *plan;
        CHECK_OK(mg_arena_plan_create(&plan));
        uint64_t limit;
        size_t n = make_random_plan(bufs, plan, &limit);
        bool ok = check_layout(bufs, n, plan, limit);
        mg_arena_summary s = summary_of(plan);
        if (s.peak_live_bytes) {
            ratio_sum += (double)s.arena_bytes / (double)s.peak_live_bytes;
            ratio_count++;
        }
        /* the same plan packs to the same layout (deterministic) */
        CHECK_OK(mg_arena_plan_set_max_chunk_bytes(plan, limit + 1));
        CHECK_OK(mg_arena_plan_set_max_chunk_bytes(plan, limit));
        mg_arena_summary again = summary_of(plan);
        CHECK(again.arena_bytes == s.arena_bytes && again.chunk_count == s.chunk_count);
        mg_arena_plan_destroy(plan);
        if (!ok || test_failures > 20)
            break;
    }
    printf("random plans: packed arena / peak-live lower bound = %.3f on average\n",
           ratio_count ? ratio_sum / ratio_count : 0.0);
}

/* ------------------------------------------------------------------ model sizing */

typedef struct expected_buffer {
    const char *name;
    uint64_t bytes;
    int first_step, last_step; /* -1, -1: whole pass */
} expected_buffer;

/* The forward model's plan (mg_fwd_plan_for_config, src/model/model_plan.c) for preset tiny
 * with BF16 weights: exactly these buffers, sizes written out here from the shapes (hidden 256,
 * 4 q / 2 kv heads of 128, intermediate 512, vocab 1024; M tokens, Mp = ceil16(M), B requests,
 * Bp = ceil16(B), P KV pages of 16), and lifetimes in the pass's steps. */
static void test_model_plan(mg_backend *b) {
    const mg_fwd_preset *p = mg_fwd_preset_find("tiny");
    CHECK(p != NULL);
    if (!p)
        return;
    mg_fwd_config c = mg_fwd_config_default(p);
    c.batch = (uint32_t)test_rand_range(2, 7);
    c.prompt_len = (uint32_t)test_rand_range(5, 40);
    c.steps = (uint32_t)test_rand_range(1, 50);
    uint64_t M = 0, P = 0;
    for (uint32_t r = 0; r < c.batch; r++) {
        const uint32_t len = mg_fwd_prompt_length(&c, r);
        M += len;
        P += (len + c.steps + 15) / 16;
    }
    const uint64_t B = c.batch, Mp = (M + 15) / 16 * 16, Bp = (B + 15) / 16 * 16;
    const uint64_t H = 256, QD = 512, KD = 256, I = 512, pitch = 1024;
    /* CPU paged attention: its four page-table arrays, carved to 16 bytes */
    const uint64_t attention = (16 * (B + 1) + 15) / 16 * 16;
    const expected_buffer want[] = {
        {"step_ids", 4 * M, -1, -1},
        {"page_qo_indptr", 4 * (B + 1), -1, -1},
        {"page_kv_indptr", 4 * (B + 1), -1, -1},
        {"page_kv_indices", 4 * P, -1, -1},
        {"page_last_len", 4 * B, -1, -1},
        {"last_token_rows", 4 * B, -1, -1},
        {"attention_workspace", attention, -1, -1},
        {"residual", 2 * M * H, -1, -1},
        {"proj_out", 2 * Mp * H, -1, -1},
        {"norm_out", 2 * Mp * H, 1, 8},
        {"qkv", 2 * Mp * (QD + 2 * KD), 2, 5},
        {"attn_out", 2 * Mp * QD, 5, 6},
        {"gate_up", 4 * Mp * I, 8, 10},
        {"mlp_act", 2 * Mp * I, 8, 10},
        {"logits_hidden", 2 * Bp * H, 16, 18},
        {"logits", 4 * Bp * pitch, 18, 19},
    };
    mg_arena_plan *plan = NULL;
    CHECK_OK(mg_fwd_plan_for_config(b, &c, &plan));
    if (!plan)
        return;
    const size_t want_count = sizeof want / sizeof want[0];
    CHECKF(mg_arena_plan_count(plan) == want_count, "tiny: %zu buffers, want %zu",
           mg_arena_plan_count(plan), want_count);
    uint64_t sum = 0;
    for (size_t i = 0; i < want_count; i++) {
        size_t index;
        sum += want[i].bytes;
        if (mg_arena_plan_find(plan, want[i].name, &index) != MG_OK) {
            CHECKF(false, "tiny: no buffer '%s'", want[i].name);
            continue;
        }
        mg_arena_buffer_info info = info_of(plan, index);
        CHECKF(info.bytes == want[i].bytes, "tiny: %s is %" PRIu64 " bytes, want %" PRIu64,
               want[i].name, info.bytes, want[i].bytes);
        if (want[i].first_step < 0)
            CHECKF(!info.has_lifetime, "tiny: %s should live the whole pass", want[i].name);
        else
            CHECKF(info.has_lifetime && info.lifetime.first_step == (uint32_t)want[i].first_step &&
                       info.lifetime.last_step == (uint32_t)want[i].last_step,
                   "tiny: %s lifetime [%u, %u], want [%d, %d]", want[i].name,
                   info.lifetime.first_step, info.lifetime.last_step, want[i].first_step,
                   want[i].last_step);
    }
    mg_arena_summary s = summary_of(plan);
    CHECKF(s.sum_bytes == sum, "tiny: sum %" PRIu64 " want %" PRIu64, s.sum_bytes, sum);
    CHECK(s.arena_bytes >= s.peak_live_bytes && s.arena_bytes < s.sum_bytes);
    printf("tiny, batch %u, prompt_len %u: unpacked %" PRIu64 " bytes, packed %" PRIu64
           " bytes, peak live %" PRIu64 "\n",
           c.batch, c.prompt_len, s.sum_bytes, s.arena_bytes, s.peak_live_bytes);
    mg_arena_plan_destroy(plan);
    c.batch = 0;
    CHECK_STATUS(mg_fwd_plan_for_config(b, &c, &plan), MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("--batch");
    CHECK(plan == NULL);
}

static void ledger_now(mg_backend *b, uint64_t *bytes, uint64_t *count) {
    *bytes = *count = UINT64_MAX;
    CHECK_OK(mg_ledger_live(b, bytes, count));
}

/* Byte pattern of buffer `index` at position `i`: differs between buffers and positions. */
static unsigned char pattern_byte(size_t index, uint64_t i) {
    return (unsigned char)((index * 131u + 7u) ^ (i * 2654435761u >> 7));
}

/* Simulates a forward pass over the arena's memory: every buffer is written with its own
 * pattern at its first step (always-live ones before step 0) and read back at its last step.
 * Anything placed over a live buffer and written in between shows up as a wrong byte. */
static bool run_lifetime_memory_test(mg_backend *b, mg_arena *arena, const random_buffer *bufs,
                                     size_t n, unsigned char *host, size_t host_bytes) {
    for (int pass = 0; pass < 2; pass++) {
        /* pass 0 writes always-live buffers; pass 1 walks the steps */
        for (uint32_t step = 0; step < (pass ? RANDOM_STEPS : 1); step++) {
            for (size_t i = 0; i < n; i++) {
                bool starts = pass ? bufs[i].has_lifetime && bufs[i].lt.first_step == step
                                   : !bufs[i].has_lifetime;
                if (!starts || !bufs[i].bytes || bufs[i].bytes > host_bytes)
                    continue;
                for (uint64_t k = 0; k < bufs[i].bytes; k++)
                    host[k] = pattern_byte(i, k);
                if (mg_copy_h2d(b, mg_arena_ptr(arena, i), host, bufs[i].bytes) != MG_OK) {
                    CHECKF(false, "writing %s: %s", bufs[i].name, mg_last_error());
                    return false;
                }
            }
            for (size_t i = 0; pass && i < n; i++) {
                bool ends =
                    bufs[i].has_lifetime ? bufs[i].lt.last_step == step : step == RANDOM_STEPS - 1;
                if (!ends || !bufs[i].bytes || bufs[i].bytes > host_bytes)
                    continue;
                memset(host, 0, bufs[i].bytes);
                if (mg_copy_d2h(b, host, mg_arena_ptr(arena, i), bufs[i].bytes) != MG_OK) {
                    CHECKF(false, "reading %s: %s", bufs[i].name, mg_last_error());
                    return false;
                }
                for (uint64_t k = 0; k < bufs[i].bytes; k++)
                    if (host[k] != pattern_byte(i, k)) {
                        CHECKF(false, "%s clobbered at byte %" PRIu64 " before its last step %u",
                               bufs[i].name, k, step);
                        return false;
                    }
            }
        }
    }
    return true;
}

static void test_random_arenas(mg_backend *b) {
    static random_buffer bufs[MAX_RANDOM_BUFFERS];
    size_t host_bytes = 2u << 20;
    unsigned char *host = malloc(host_bytes);
    CHECK(host != NULL);
    uint64_t base_bytes, base_count;
    ledger_now(b, &base_bytes, &base_count);
    for (int iter = 0; iter < 60 && host; iter++) {
        mg_arena_plan *plan;
        CHECK_OK(mg_arena_plan_create(&plan));
        uint64_t limit;
        size_t n = make_random_plan(bufs, plan, &limit);
        mg_arena *arena = NULL;
        CHECK_OK(mg_arena_create(b, plan, &arena));
        mg_arena_summary s = summary_of(plan);
        mg_arena_plan_destroy(plan); /* the arena keeps its own copy */
        if (!arena)
            break;
        uint64_t live_bytes, live_count;
        ledger_now(b, &live_bytes, &live_count);
        CHECKF(live_count - base_count == s.chunk_count, "%" PRIu64 " allocations for %u chunks",
               live_count - base_count, s.chunk_count);
        CHECK(live_bytes - base_bytes == s.device_bytes);
        CHECK(mg_arena_count(arena) == n);
        mg_arena_summary as;
        CHECK_OK(mg_arena_summary_get(arena, &as));
        CHECK(as.arena_bytes == s.arena_bytes && as.sum_bytes == s.sum_bytes);
        for (size_t i = 0; i < n; i++) {
            mg_devptr p = mg_arena_ptr(arena, i);
            mg_arena_buffer_info info;
            CHECK_OK(mg_arena_buffer(arena, i, &info));
            CHECK(info.ptr == p && info.bytes == bufs[i].bytes);
            if (!bufs[i].bytes) {
                CHECK(p == 0);
                continue;
            }
            CHECKF(p && p % bufs[i].alignment == 0, "%s at %#" PRIx64 " alignment %" PRIu64,
                   bufs[i].name, p, bufs[i].alignment);
            mg_devptr by_name = 0;
            uint64_t by_name_bytes = 0;
            CHECK_OK(mg_arena_find(arena, bufs[i].name, &by_name, &by_name_bytes));
            CHECK(by_name == p && by_name_bytes == bufs[i].bytes);
            CHECK(mg_arena_index(arena, bufs[i].name) == i);
        }
        bool ok = run_lifetime_memory_test(b, arena, bufs, n, host, host_bytes);
        CHECK_OK(mg_arena_destroy(arena));
        ledger_now(b, &live_bytes, &live_count);
        CHECK(live_bytes == base_bytes && live_count == base_count);
        if (!ok || test_failures > 20)
            break;
    }
    free(host);
}

static mg_arena_plan *chunked_plan(uint32_t *chunks_out) {
    mg_arena_plan *plan = NULL;
    CHECK_OK(mg_arena_plan_create(&plan));
    mg_arena_lifetime early = {0, 2}, late = {3, 5};
    CHECK_OK(mg_arena_plan_add(plan, "weights_a", 40000, 0, NULL, NULL));
    CHECK_OK(mg_arena_plan_add(plan, "weights_b", 40000, 0, NULL, NULL));
    CHECK_OK(mg_arena_plan_add(plan, "scratch_early", 30000, 4096, &early, NULL));
    CHECK_OK(mg_arena_plan_add(plan, "scratch_late", 30000, 0, &late, NULL));
    CHECK_OK(mg_arena_plan_add(plan, "nothing", 0, 0, NULL, NULL));
    CHECK_OK(mg_arena_plan_add(plan, "big_one", 60000, 0, NULL, NULL));
    CHECK_OK(mg_arena_plan_set_max_chunk_bytes(plan, 65536));
    mg_arena_summary s = summary_of(plan);
    *chunks_out = s.chunk_count;
    return plan;
}

static void test_arena_lifecycle(mg_backend *b) {
    uint64_t base_bytes, base_count, bytes, count;
    ledger_now(b, &base_bytes, &base_count);
    uint32_t chunks = 0;
    mg_arena_plan *plan = chunked_plan(&chunks);
    CHECKF(chunks >= 3, "%u chunks", chunks);

    mg_arena *arena = NULL;
    CHECK_OK(mg_arena_create(b, plan, &arena));
    if (!arena) {
        mg_arena_plan_destroy(plan);
        return;
    }
    ledger_now(b, &bytes, &count);
    CHECK(count == base_count + chunks);
    /* lookups */
    size_t nothing = mg_arena_index(arena, "nothing");
    CHECK(nothing == 4 && mg_arena_ptr(arena, nothing) == 0);
    mg_devptr p = 1;
    uint64_t n = 1;
    CHECK_OK(mg_arena_find(arena, "nothing", &p, &n));
    CHECK(p == 0 && n == 0);
    CHECK_STATUS(mg_arena_find(arena, "missing", &p, &n), MG_ERR_NOT_FOUND);
    CHECK_MESSAGE("no buffer named 'missing'");
    CHECK(mg_arena_index(arena, "missing") == SIZE_MAX);
    CHECK(mg_arena_ptr(arena, 6) == 0 && mg_arena_ptr(arena, SIZE_MAX) == 0);
    mg_arena_buffer_info info;
    CHECK_STATUS(mg_arena_buffer(arena, 6, &info), MG_ERR_INVALID_ARGUMENT);
    CHECK(mg_arena_ptr(arena, 2) % 4096 == 0);
    /* early and late scratch may share bytes; weights never share with anything */
    mg_devptr wa = mg_arena_ptr(arena, 0), wb = mg_arena_ptr(arena, 1);
    CHECK(wa && wb && (wa + 40000 <= wb || wb + 40000 <= wa));
    /* addresses are stable: asking again gives the same */
    CHECK(mg_arena_ptr(arena, 0) == wa);

    /* release: memory back, addresses read 0, idempotent */
    CHECK_OK(mg_arena_release(arena));
    ledger_now(b, &bytes, &count);
    CHECK(bytes == base_bytes && count == base_count);
    CHECK(mg_arena_ptr(arena, 0) == 0);
    CHECK_OK(mg_arena_find(arena, "weights_a", &p, &n));
    CHECK(p == 0 && n == 40000);
    CHECK_OK(mg_arena_release(arena));
    CHECK_OK(mg_arena_destroy(arena));
    CHECK_OK(mg_arena_release(NULL));
    CHECK_OK(mg_arena_destroy(NULL));

    /* bad arguments */
    arena = (mg_arena *)1;
    CHECK_STATUS(mg_arena_create(NULL, plan, &arena), MG_ERR_INVALID_ARGUMENT);
    CHECK(arena == NULL);
    CHECK_STATUS(mg_arena_create(b, NULL, &arena), MG_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(mg_arena_create(b, plan, NULL), MG_ERR_INVALID_ARGUMENT);
    mg_arena_plan_destroy(plan);
}

/* Out-of-memory at each allocation of a creation: everything taken is given back. */
static void test_arena_out_of_memory(mg_backend *b) {
    uint64_t base_bytes, base_count, bytes, count;
    ledger_now(b, &base_bytes, &base_count);
    uint32_t chunks = 0;
    mg_arena_plan *plan = chunked_plan(&chunks);
    for (uint32_t nth = 1; nth <= chunks; nth++) {
        CHECK_OK(mg_cpu_fail_nth_allocation(b, nth));
        mg_arena *arena = (mg_arena *)1;
        mg_clear_error();
        CHECK_STATUS(mg_arena_create(b, plan, &arena), MG_ERR_OUT_OF_MEMORY);
        CHECK(arena == NULL);
        char want[64];
        snprintf(want, sizeof want, "mg_arena_create: chunk %u of %u, ", nth, chunks);
        CHECK_MESSAGE(want);
        CHECK_MESSAGE("largest '");
        CHECK_MESSAGE(" bytes");
        CHECK_MESSAGE("test_arena.c:"); /* the caller's site, from the allocation */
        ledger_now(b, &bytes, &count);
        CHECKF(bytes == base_bytes && count == base_count,
               "failure at allocation %u left %" PRIu64 " bytes in %" PRIu64 " allocations", nth,
               bytes - base_bytes, count - base_count);
    }
    /* one past the last allocation: creation succeeds */
    CHECK_OK(mg_cpu_fail_nth_allocation(b, chunks + 1));
    mg_arena *arena = NULL;
    CHECK_OK(mg_arena_create(b, plan, &arena));
    CHECK_OK(mg_cpu_fail_nth_allocation(b, 0));
    CHECK_OK(mg_arena_destroy(arena));

    /* a single-chunk arena over an allocation cap: the message names the biggest buffer */
    CHECK_OK(mg_arena_plan_set_max_chunk_bytes(plan, 0));
    CHECK_OK(mg_cpu_set_allocation_cap(b, base_bytes + 100000));
    arena = (mg_arena *)1;
    CHECK_STATUS(mg_arena_create(b, plan, &arena), MG_ERR_OUT_OF_MEMORY);
    CHECK(arena == NULL);
    CHECK_MESSAGE("chunk 1 of 1");
    CHECK_MESSAGE("5 buffers, largest 'big_one' of 60000 bytes");
    CHECK_OK(mg_cpu_set_allocation_cap(b, 0));
    ledger_now(b, &bytes, &count);
    CHECK(bytes == base_bytes && count == base_count);

    /* creation is refused while a stream captures, and leaves nothing behind */
    if (mg_backend_supports(b, MG_CAP_GRAPHS)) {
        mg_stream *s = NULL;
        CHECK_OK(mg_stream_create(b, &s));
        CHECK_OK(mg_graph_begin_capture(s));
        CHECK_STATUS(mg_arena_create(b, plan, &arena), MG_ERR_CAPTURING);
        CHECK(arena == NULL);
        CHECK_OK(mg_graph_abort_capture(s));
        CHECK_OK(mg_stream_destroy(s));
        ledger_now(b, &bytes, &count);
        CHECK(bytes == base_bytes && count == base_count);
    }
    mg_arena_plan_destroy(plan);
}

/* The forward model's plan of a MoE preset with FP8 weights on the device: every buffer
 * reachable, the lifetime memory test passes. */
static void test_model_arena(mg_backend *b) {
    mg_fwd_config c = mg_fwd_config_default(mg_fwd_preset_find("tiny-moe"));
    c.weights = MG_FWD_WEIGHTS_FP8;
    c.batch = 3;
    c.prompt_len = 13;
    mg_arena_plan *plan = NULL;
    CHECK_OK(mg_fwd_plan_for_config(b, &c, &plan));
    mg_arena *arena = NULL;
    CHECK_OK(mg_arena_create(b, plan, &arena));
    if (arena) {
        static random_buffer bufs[MAX_RANDOM_BUFFERS];
        size_t n = mg_arena_count(arena);
        CHECK(n <= MAX_RANDOM_BUFFERS);
        for (size_t i = 0; i < n && i < MAX_RANDOM_BUFFERS; i++) {
            mg_arena_buffer_info info;
            CHECK_OK(mg_arena_buffer(arena, i, &info));
            snprintf(bufs[i].name, sizeof bufs[i].name, "%s", info.name);
            bufs[i].bytes = info.bytes;
            bufs[i].alignment = info.alignment;
            bufs[i].has_lifetime = info.has_lifetime;
            bufs[i].lt = info.lifetime;
        }
        size_t host_bytes = 64u << 20;
        unsigned char *host = malloc(host_bytes);
        CHECK(host != NULL);
        if (host)
            run_lifetime_memory_test(b, arena, bufs, n, host, host_bytes);
        free(host);
    }
    CHECK_OK(mg_arena_destroy(arena));
    mg_arena_plan_destroy(plan);
}

int main(int argc, char **argv) {
    (void)argc;
    (void)argv;
    test_seed();
    test_plan_arguments();
    test_sharing_rules();
    test_random_plans();

    mg_backend *b = NULL;
    CHECK_OK(mg_backend_open(MG_BACKEND_CPU, 0, &b));
    if (b) {
        test_random_arenas(b);
        test_arena_lifecycle(b);
        test_arena_out_of_memory(b);
        test_model_plan(b);
        test_model_arena(b);
        uint64_t bytes, count;
        ledger_now(b, &bytes, &count);
        CHECKF(bytes == 0 && count == 0, "%" PRIu64 " bytes in %" PRIu64 " allocations leaked",
               bytes, count);
        CHECK_OK(mg_backend_close(b));
    }
    return test_finish();
}
