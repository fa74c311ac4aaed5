/*
 * test_host_heap.c - the default pinned-host allocation (metrale/host_heap.h): zeroed,
 * 64-byte aligned, size rounded to 64, bad arguments and out-of-memory reported with a
 * message, free of NULL a no-op.
 */
#include <stdint.h>

#include "metrale/host_heap.h"
#include "utils_test_support.h"

/* Under AddressSanitizer a huge request would abort instead of returning NULL; ask the
 * allocator to return NULL so the library's out-of-memory path is what gets tested. */
const char *__asan_default_options(void);
const char *__asan_default_options(void) {
    return "allocator_may_return_null=1";
}

static bool all_zero(const unsigned char *p, size_t bytes) {
    for (size_t i = 0; i < bytes; i++)
        if (p[i])
            return false;
    return true;
}

static void test_sizes(void) {
    const size_t sizes[] = {1, 7, 63, 64, 65, 100, 4095, 4096, 4097, 12345, 1 << 20, (1 << 22) + 3};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        size_t bytes = sizes[i];
        size_t rounded = (bytes + 63) / 64 * 64;
        void *p = (void *)0x1; /* poison: must be overwritten */
        mg_status st = mg_host_heap_alloc(bytes, &p);
        CHECKF(st == MG_OK, "alloc %zu: %s", bytes, mg_last_error());
        if (st != MG_OK)
            continue;
        CHECKF(((uintptr_t)p % MG_HOST_HEAP_ALIGNMENT) == 0, "alloc %zu: %p not 64-aligned", bytes,
               p);
        /* the whole rounded size is usable and zeroed (ASan would flag an overrun) */
        CHECKF(all_zero(p, rounded), "alloc %zu: not zeroed", bytes);
        memset(p, 0xEE, rounded);
        mg_host_heap_free(p);
        /* a second block of the same size is zeroed again, also if the heap reuses the first */
        void *q = NULL;
        CHECK(mg_host_heap_alloc(bytes, &q) == MG_OK);
        if (q) {
            CHECKF(all_zero(q, rounded), "realloc %zu: not zeroed", bytes);
            mg_host_heap_free(q);
        }
    }
}

static void test_bad_arguments(void) {
    mg_clear_error();
    CHECK(mg_host_heap_alloc(16, NULL) == MG_ERR_INVALID_ARGUMENT);
    CHECKF(strstr(mg_last_error(), "NULL output pointer") != NULL, "message: %s", mg_last_error());

    void *p = (void *)0x1;
    mg_clear_error();
    CHECK(mg_host_heap_alloc(0, &p) == MG_ERR_INVALID_ARGUMENT);
    CHECK(p == NULL); /* the output is cleared on failure */
    CHECKF(strstr(mg_last_error(), "zero bytes") != NULL, "message: %s", mg_last_error());

    p = (void *)0x1;
    mg_clear_error();
    CHECK(mg_host_heap_alloc(SIZE_MAX, &p) == MG_ERR_OUT_OF_MEMORY);
    CHECK(p == NULL);
    CHECKF(strstr(mg_last_error(), "too large") != NULL, "message: %s", mg_last_error());

    p = (void *)0x1;
    mg_clear_error();
    CHECK(mg_host_heap_alloc(SIZE_MAX - 63, &p) == MG_ERR_OUT_OF_MEMORY);
    CHECK(p == NULL);

    /* a request the system cannot satisfy: the message names the rounded size */
    p = (void *)0x1;
    mg_clear_error();
    CHECK(mg_host_heap_alloc((size_t)1 << 62, &p) == MG_ERR_OUT_OF_MEMORY);
    CHECK(p == NULL);
    CHECKF(strstr(mg_last_error(), "out of memory") != NULL &&
               strstr(mg_last_error(), "4096.0 PiB") != NULL,
           "message: %s", mg_last_error());

    mg_host_heap_free(NULL); /* no-op */
}

int main(void) {
    test_sizes();
    test_bad_arguments();
    return test_finish();
}
