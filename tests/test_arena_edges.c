/*
 * test_arena_edges.c - metrale/arena.h at its edges, beyond test_arena: NULL arguments of
 * every plan and arena call, queries on a plan whose packing fails, layouts whose offsets
 * would pass 2^64 bytes (by alignment or by size), plans of empty buffers only, the printed
 * plan, and releasing an arena after its backend closed.
 */
#include <stdint.h>
#include <stdlib.h>

#include "metrale/arena.h"
#include "metrale/gpu.h"
#include "test_util.h"

#define CHECK_ERROR(expr, status, needle)                                                          \
    do {                                                                                           \
        mg_clear_error();                                                                          \
        CHECK_STATUS(expr, status);                                                                \
        CHECK_MESSAGE(needle);                                                                     \
    } while (0)

static void test_plan_null_arguments(void) {
    mg_arena_plan *plan = NULL;
    mg_arena_summary summary;
    mg_arena_buffer_info info;
    size_t index = 0;
    CHECK_OK(mg_arena_plan_create(&plan));
    CHECK_ERROR(mg_arena_plan_add(NULL, "x", 1, 0, NULL, NULL), MG_ERR_INVALID_ARGUMENT,
                "NULL plan");
    CHECK_ERROR(mg_arena_plan_add(plan, NULL, 1, 0, NULL, NULL), MG_ERR_INVALID_ARGUMENT,
                "NULL name");
    CHECK_ERROR(mg_arena_plan_add(plan, "x", 1, 3, NULL, NULL), MG_ERR_INVALID_ARGUMENT,
                "alignment 3 is not a power of two");
    CHECK_ERROR(mg_arena_plan_add(plan, "x", 1, 1ull << 31, NULL, NULL), MG_ERR_INVALID_ARGUMENT,
                "alignment 2147483648 is not a power of two <= 1073741824");
    CHECK_ERROR(mg_arena_plan_set_max_chunk_bytes(NULL, 1), MG_ERR_INVALID_ARGUMENT, "NULL plan");
    CHECK(mg_arena_plan_count(NULL) == 0);
    CHECK_ERROR(mg_arena_plan_pack(NULL), MG_ERR_INVALID_ARGUMENT, "NULL plan");
    CHECK_ERROR(mg_arena_plan_summary(NULL, &summary), MG_ERR_INVALID_ARGUMENT, "NULL plan");
    CHECK_ERROR(mg_arena_plan_summary(plan, NULL), MG_ERR_INVALID_ARGUMENT, "NULL output");
    CHECK_ERROR(mg_arena_plan_buffer(plan, 0, NULL), MG_ERR_INVALID_ARGUMENT, "NULL output");
    CHECK_ERROR(mg_arena_plan_find(NULL, "x", &index), MG_ERR_INVALID_ARGUMENT, "NULL argument");
    CHECK_ERROR(mg_arena_plan_find(plan, NULL, &index), MG_ERR_INVALID_ARGUMENT, "NULL argument");
    CHECK_ERROR(mg_arena_plan_find(plan, "x", NULL), MG_ERR_INVALID_ARGUMENT, "NULL argument");
    CHECK_ERROR(mg_arena_plan_print(plan, NULL), MG_ERR_INVALID_ARGUMENT, "NULL stream");
    CHECK_ERROR(mg_arena_plan_create(NULL), MG_ERR_INVALID_ARGUMENT, "NULL output pointer");

    /* every query packs first, and reports a packing failure */
    CHECK_OK(mg_arena_plan_add(plan, "big", 5000, 0, NULL, NULL));
    CHECK_OK(mg_arena_plan_set_max_chunk_bytes(plan, 4096));
    CHECK_ERROR(mg_arena_plan_buffer(plan, 0, &info), MG_ERR_INVALID_ARGUMENT,
                "buffer 'big' of 5000 bytes exceeds the per-allocation limit of 4096 bytes");
    CHECK_ERROR(mg_arena_plan_print(plan, stderr), MG_ERR_INVALID_ARGUMENT, "'big'");
    mg_backend *b = NULL;
    mg_arena *arena = (mg_arena *)plan;
    CHECK_OK(mg_backend_open(MG_BACKEND_CPU, 4, &b));
    CHECK_ERROR(mg_arena_create(b, plan, &arena), MG_ERR_INVALID_ARGUMENT, "'big'");
    CHECK(arena == NULL);
    CHECK_ERROR(mg_arena_create(b, plan, NULL), MG_ERR_INVALID_ARGUMENT, "NULL output pointer");
    CHECK_ERROR(mg_arena_create(NULL, plan, &arena), MG_ERR_INVALID_ARGUMENT, "NULL backend");
    CHECK_ERROR(mg_arena_create(b, NULL, &arena), MG_ERR_INVALID_ARGUMENT, "NULL plan");
    CHECK_OK(mg_backend_close(b));
    mg_arena_plan_destroy(plan);
}

static void test_arena_null_arguments(void) {
    mg_devptr ptr = 1;
    uint64_t bytes = 1;
    mg_arena_buffer_info info;
    mg_arena_summary summary;
    CHECK(mg_arena_count(NULL) == 0);
    CHECK(mg_arena_ptr(NULL, 0) == 0);
    CHECK(mg_arena_index(NULL, "x") == SIZE_MAX);
    CHECK_ERROR(mg_arena_find(NULL, "x", &ptr, &bytes), MG_ERR_INVALID_ARGUMENT, "NULL arena");
    CHECK_ERROR(mg_arena_buffer(NULL, 0, &info), MG_ERR_INVALID_ARGUMENT, "NULL argument");
    CHECK_ERROR(mg_arena_summary_get(NULL, &summary), MG_ERR_INVALID_ARGUMENT, "NULL argument");
    CHECK_OK(mg_arena_release(NULL));
    CHECK_OK(mg_arena_destroy(NULL));

    mg_backend *b = NULL;
    mg_arena_plan *plan = NULL;
    mg_arena *arena = NULL;
    CHECK_OK(mg_backend_open(MG_BACKEND_CPU, 4, &b));
    CHECK_OK(mg_arena_plan_create(&plan));
    CHECK_OK(mg_arena_plan_add(plan, "a", 300, 0, NULL, NULL));
    CHECK_OK(mg_arena_plan_add(plan, "empty", 0, 0, NULL, NULL));
    CHECK_OK(mg_arena_create(b, plan, &arena));
    mg_arena_plan_destroy(plan);
    CHECK_ERROR(mg_arena_find(arena, NULL, &ptr, &bytes), MG_ERR_INVALID_ARGUMENT, "NULL name");
    CHECK_ERROR(mg_arena_find(arena, "missing", &ptr, &bytes), MG_ERR_NOT_FOUND,
                "no buffer named 'missing'");
    CHECK_OK(mg_arena_find(arena, "a", NULL, NULL)); /* the outputs are optional */
    CHECK_OK(mg_arena_find(arena, "empty", &ptr, &bytes));
    CHECK(ptr == 0 && bytes == 0);
    CHECK(mg_arena_index(arena, NULL) == SIZE_MAX);
    CHECK(mg_arena_ptr(arena, 2) == 0);
    CHECK_ERROR(mg_arena_buffer(arena, 0, NULL), MG_ERR_INVALID_ARGUMENT, "NULL argument");
    CHECK_ERROR(mg_arena_buffer(arena, 2, &info), MG_ERR_INVALID_ARGUMENT,
                "index 2 out of range (2 buffers)");
    CHECK_ERROR(mg_arena_summary_get(arena, NULL), MG_ERR_INVALID_ARGUMENT, "NULL argument");
    CHECK_OK(mg_arena_summary_get(arena, &summary));
    CHECK(summary.buffer_count == 2 && summary.sum_bytes == 300 && summary.chunk_count == 1);

    /* released after its backend closed: the close freed the memory, the release reports
     * that it could not, and the arena reads as released */
    CHECK(mg_arena_ptr(arena, 0) != 0);
    CHECK_OK(mg_backend_close(b));
    CHECK_ERROR(mg_arena_release(arena), MG_ERR_INVALID_ARGUMENT,
                "mg_arena_release: mg_free: invalid or closed backend");
    CHECK(mg_arena_ptr(arena, 0) == 0);
    CHECK_OK(mg_arena_release(arena)); /* idempotent */
    CHECK_OK(mg_arena_destroy(arena));
}

/* Offsets past 2^64 bytes are refused, whether the alignment or the size carries them over. */
static void test_layout_overflow(void) {
    struct {
        uint64_t a, b;
        const char *needle;
    } cases[] = {
        {UINT64_MAX - 100, 50, "layout exceeds 2^64 bytes at buffer 'second'"},  /* alignment */
        {UINT64_MAX - 300, 300, "layout exceeds 2^64 bytes at buffer 'second'"}, /* the end */
        {1ull << 63, 1ull << 63, "sizes add up to more than 2^64 bytes at 'second'"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        mg_arena_plan *plan = NULL;
        CHECK_OK(mg_arena_plan_create(&plan));
        CHECK_OK(mg_arena_plan_add(plan, "first", cases[i].a, 0, NULL, NULL));
        CHECK_OK(mg_arena_plan_add(plan, "second", cases[i].b, 0, NULL, NULL));
        CHECK_ERROR(mg_arena_plan_pack(plan), MG_ERR_INVALID_ARGUMENT, cases[i].needle);
        mg_arena_plan_destroy(plan);
    }
    /* the same sizes at disjoint steps share bytes and fit */
    mg_arena_plan *plan = NULL;
    mg_arena_lifetime early = {0, 1}, late = {2, 3};
    CHECK_OK(mg_arena_plan_create(&plan));
    CHECK_OK(mg_arena_plan_add(plan, "first", UINT64_MAX - 300, 0, &early, NULL));
    CHECK_OK(mg_arena_plan_add(plan, "second", 300, 0, &late, NULL));
    mg_arena_summary s;
    CHECK_OK(mg_arena_plan_summary(plan, &s));
    CHECK(s.arena_bytes == UINT64_MAX - 300 && s.peak_live_bytes == UINT64_MAX - 300);
    mg_arena_plan_destroy(plan);
}

/* A plan of empty buffers has no chunk and prints a ratio of 1; lifetimes print as steps. */
static void test_print(void) {
    mg_arena_plan *plan = NULL;
    mg_arena_lifetime life = {2, 5};
    CHECK_OK(mg_arena_plan_create(&plan));
    CHECK_OK(mg_arena_plan_add(plan, "nothing", 0, 0, &life, NULL));
    CHECK_OK(mg_arena_plan_add(plan, "nothing_always", 0, 4096, NULL, NULL));
    FILE *f = tmpfile();
    CHECK(f != NULL);
    if (f) {
        CHECK_OK(mg_arena_plan_print(plan, f));
        rewind(f);
        char text[2048] = "";
        size_t n = fread(text, 1, sizeof text - 1, f);
        text[n] = '\0';
        CHECK(strstr(text, "[2, 5]") != NULL);
        CHECK(strstr(text, "always") != NULL);
        CHECK(strstr(text, "buffers 2, chunks 0\n") != NULL);
        CHECK(strstr(text, "packed/unpacked 1.0000\n") != NULL);
        fclose(f);
    }
    mg_arena_summary s;
    CHECK_OK(mg_arena_plan_summary(plan, &s));
    CHECK(s.chunk_count == 0 && s.arena_bytes == 0 && s.device_bytes == 0);
    mg_backend *b = NULL;
    mg_arena *arena = NULL;
    CHECK_OK(mg_backend_open(MG_BACKEND_CPU, 4, &b));
    CHECK_OK(mg_arena_create(b, plan, &arena));
    CHECK(mg_arena_count(arena) == 2 && mg_arena_ptr(arena, 0) == 0 && mg_arena_ptr(arena, 1) == 0);
    uint64_t live_count = 1;
    CHECK_OK(mg_ledger_live(b, NULL, &live_count));
    CHECK(live_count == 0); /* nothing was allocated */
    CHECK_OK(mg_arena_destroy(arena));
    CHECK_OK(mg_backend_close(b));
    mg_arena_plan_destroy(plan);
}

int main(void) {
    test_plan_null_arguments();
    test_arena_null_arguments();
    test_layout_overflow();
    test_print();
    return test_finish();
}
