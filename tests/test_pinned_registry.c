/*
 * test_pinned_registry.c - the page-locked host range registry (metrale/pinned.h): sub-range
 * hits, neighbour / straddle / NULL / empty misses, re-registering a base, overlap refusal,
 * unregister, and a random operation sequence checked against a brute-force model.
 *
 * The registry only stores addresses and never dereferences them, so most cases use
 * synthetic addresses far from anything mapped; one case uses real heap memory.
 */
#include <stdint.h>

#include "metrale/pinned.h"
#include "utils_test_support.h"

#define AT(addr) ((const void *)(uintptr_t)(addr))

static const uintptr_t BASE = (uintptr_t)0x100000000000ull; /* 16 TiB: synthetic region */

static void expect_error(mg_status st, mg_status want, const char *needle) {
    CHECKF(st == want, "status %s, want %s", mg_status_name(st), mg_status_name(want));
    CHECKF(strstr(mg_last_error(), needle) != NULL, "message '%s' lacks '%s'", mg_last_error(),
           needle);
}

static void test_lookup_rules(void) {
    const uintptr_t a = BASE, a_len = 4096;
    CHECK(mg_pinned_count() == 0);
    CHECK(mg_pinned_register(AT(a), a_len) == MG_OK);
    CHECK(mg_pinned_count() == 1);

    /* sub-ranges hit */
    CHECK(mg_pinned_contains(AT(a), a_len));
    CHECK(mg_pinned_contains(AT(a), 1));
    CHECK(mg_pinned_contains(AT(a + 100), 10));
    CHECK(mg_pinned_contains(AT(a + a_len - 1), 1));
    CHECK(mg_pinned_contains(AT(a + 1), a_len - 1));
    /* neighbours, straddles, NULL and empty miss */
    CHECK(!mg_pinned_contains(AT(a + a_len), 1));      /* right neighbour */
    CHECK(!mg_pinned_contains(AT(a - 1), 1));          /* left neighbour */
    CHECK(!mg_pinned_contains(AT(a - 1), 2));          /* straddles the start */
    CHECK(!mg_pinned_contains(AT(a + a_len - 1), 2));  /* straddles the end */
    CHECK(!mg_pinned_contains(AT(a), a_len + 1));      /* one byte too long */
    CHECK(!mg_pinned_contains(AT(a - 8), a_len + 16)); /* covers it */
    CHECK(!mg_pinned_contains(NULL, 16));
    CHECK(!mg_pinned_contains(AT(a), 0));
    CHECK(!mg_pinned_contains(AT(a + 10), 0));
    CHECK(!mg_pinned_contains(AT(a + 10), SIZE_MAX)); /* would wrap */

    /* an adjacent range: each hit on its own, a straddle of both is still a miss */
    const uintptr_t b = a + a_len;
    CHECK(mg_pinned_register(AT(b), 100) == MG_OK);
    CHECK(mg_pinned_contains(AT(b), 100));
    CHECK(mg_pinned_contains(AT(b + 99), 1));
    CHECK(!mg_pinned_contains(AT(b + 99), 2));
    CHECK(!mg_pinned_contains(AT(a + a_len - 8), 16));

    /* re-registering a base replaces its length (shrink, then grow back) */
    CHECK(mg_pinned_register(AT(a), 50) == MG_OK);
    CHECK(mg_pinned_count() == 2);
    CHECK(mg_pinned_contains(AT(a + 49), 1));
    CHECK(!mg_pinned_contains(AT(a + 50), 1));
    CHECK(!mg_pinned_contains(AT(a), 51));
    CHECK(mg_pinned_register(AT(a), a_len) == MG_OK);
    CHECK(mg_pinned_contains(AT(a + a_len - 1), 1));
    /* ... but growing into the next range is refused and keeps the old length */
    mg_clear_error();
    expect_error(mg_pinned_register(AT(a), a_len + 1), MG_ERR_INVALID_ARGUMENT, "overlaps");
    CHECK(mg_pinned_contains(AT(a + a_len - 1), 1));
    CHECK(mg_pinned_count() == 2);

    /* overlapping registrations are refused and change nothing */
    mg_clear_error();
    expect_error(mg_pinned_register(AT(a + 10), 10), MG_ERR_INVALID_ARGUMENT, "overlaps");
    expect_error(mg_pinned_register(AT(a - 10), 11), MG_ERR_INVALID_ARGUMENT, "overlaps");
    expect_error(mg_pinned_register(AT(a - 10), 1 << 20), MG_ERR_INVALID_ARGUMENT, "overlaps");
    CHECK(mg_pinned_register(AT(a - 10), 10) == MG_OK); /* touching is not overlapping */
    CHECK(mg_pinned_count() == 3);
    CHECK(mg_pinned_unregister(AT(a - 10)) == MG_OK);

    /* bad registrations */
    expect_error(mg_pinned_register(NULL, 10), MG_ERR_INVALID_ARGUMENT, "NULL base");
    expect_error(mg_pinned_register(AT(a + 1 * 1000000), 0), MG_ERR_INVALID_ARGUMENT,
                 "zero length");
    expect_error(mg_pinned_register(AT(UINTPTR_MAX - 10), 20), MG_ERR_INVALID_ARGUMENT, "wraps");
    CHECK(mg_pinned_count() == 2);

    /* unregister: only exact bases; twice is NOT_FOUND */
    expect_error(mg_pinned_unregister(AT(a + 1)), MG_ERR_NOT_FOUND, "not a registered base");
    expect_error(mg_pinned_unregister(NULL), MG_ERR_NOT_FOUND, "not a registered base");
    CHECK(mg_pinned_contains(AT(a + 1), 1)); /* the failed calls removed nothing */
    CHECK(mg_pinned_unregister(AT(a)) == MG_OK);
    CHECK(!mg_pinned_contains(AT(a), 1));
    CHECK(!mg_pinned_contains(AT(a + 100), 10));
    CHECK(mg_pinned_contains(AT(b), 100)); /* the neighbour survives */
    expect_error(mg_pinned_unregister(AT(a)), MG_ERR_NOT_FOUND, "not a registered base");
    CHECK(mg_pinned_unregister(AT(b)) == MG_OK);
    CHECK(mg_pinned_count() == 0);
}

/* Real memory: a heap block registered, sub-ranges found, unregistered before free. */
static void test_real_memory(void) {
    size_t bytes = 1 << 16;
    unsigned char *p = malloc(bytes);
    CHECK(p != NULL);
    if (!p)
        return;
    CHECK(mg_pinned_register(p, bytes) == MG_OK);
    CHECK(mg_pinned_contains(p + 1000, 2000));
    CHECK(!mg_pinned_contains(p + bytes - 10, 11));
    CHECK(mg_pinned_unregister(p) == MG_OK);
    free(p);
}

/* ------------------------------------------------------------------ model check */

#define MODEL_MAX 512

typedef struct model_range {
    uintptr_t base;
    size_t bytes;
} model_range;

static model_range model[MODEL_MAX];
static size_t model_count;

static long model_find_base(uintptr_t base) {
    for (size_t i = 0; i < model_count; i++)
        if (model[i].base == base)
            return (long)i;
    return -1;
}

static bool model_overlaps_other(uintptr_t base, size_t bytes) {
    for (size_t i = 0; i < model_count; i++)
        if (model[i].base != base && base < model[i].base + model[i].bytes &&
            model[i].base < base + bytes)
            return true;
    return false;
}

static bool model_contains(uintptr_t p, size_t bytes) {
    if (!p || !bytes)
        return false;
    for (size_t i = 0; i < model_count; i++)
        if (p >= model[i].base && p + bytes <= model[i].base + model[i].bytes)
            return true;
    return false;
}

static void test_against_model(void) {
    /* Addresses in a 64 KiB window so ranges collide often; lengths 1..600. */
    const uintptr_t window = BASE + (1ull << 30);
    for (int op = 0; op < 60000; op++) {
        uint64_t r = test_rand();
        uintptr_t addr = window + (uintptr_t)(test_rand() % 65536);
        size_t len = 1 + (size_t)(test_rand() % 600);
        switch (r % 8) {
        case 0:
        case 1: { /* register (maybe a re-register of an existing base) */
            if (model_count > 0 && r % 16 < 4)
                addr = model[test_rand() % model_count].base;
            long at = model_find_base(addr);
            bool ok = !model_overlaps_other(addr, len) && (at >= 0 || model_count < MODEL_MAX);
            mg_status st = mg_pinned_register(AT(addr), len);
            CHECKF((st == MG_OK) == ok, "register(%#lx, %zu) = %s, model says %d",
                   (unsigned long)addr, len, mg_status_name(st), (int)ok);
            if (st == MG_OK) {
                if (at >= 0)
                    model[at].bytes = len;
                else
                    model[model_count++] = (model_range){addr, len};
            }
            break;
        }
        case 2: { /* unregister an existing base, or a random address */
            if (model_count > 0 && r % 16 < 12)
                addr = model[test_rand() % model_count].base;
            long at = model_find_base(addr);
            mg_status st = mg_pinned_unregister(AT(addr));
            CHECKF((st == MG_OK) == (at >= 0), "unregister(%#lx) = %s", (unsigned long)addr,
                   mg_status_name(st));
            if (at >= 0)
                model[at] = model[--model_count];
            break;
        }
        default: { /* lookups, often near range edges */
            if (model_count > 0 && r % 16 < 10) {
                model_range m = model[test_rand() % model_count];
                int64_t jitter = (int64_t)(test_rand() % 9) - 4;
                addr = (uintptr_t)((int64_t)m.base + jitter + (int64_t)(test_rand() % m.bytes));
                len = (size_t)(test_rand() % (m.bytes + 4));
            }
            bool got = mg_pinned_contains(AT(addr), len);
            CHECKF(got == model_contains(addr, len), "contains(%#lx, %zu) = %d",
                   (unsigned long)addr, len, (int)got);
            break;
        }
        }
        if (test_failures > 20)
            return;
    }
    CHECK(mg_pinned_count() == model_count);
    while (model_count > 0) {
        CHECK(mg_pinned_unregister(AT(model[model_count - 1].base)) == MG_OK);
        model_count--;
    }
    CHECK(mg_pinned_count() == 0);
}

/* Many ranges: growth of the registry and lookups in a long sorted array. */
static void test_many_ranges(void) {
    const size_t n = 5000;
    const uintptr_t start = BASE + (2ull << 30);
    /* register in a scrambled order so inserts land in the middle */
    for (size_t k = 0; k < n; k++) {
        size_t i = (k * 2654435761u) % n;
        CHECK(mg_pinned_register(AT(start + i * 256), 128) == MG_OK);
    }
    CHECK(mg_pinned_count() == n);
    size_t hits = 0, misses = 0;
    for (size_t i = 0; i < n; i++) {
        hits += mg_pinned_contains(AT(start + i * 256 + 64), 64);
        misses += !mg_pinned_contains(AT(start + i * 256 + 128), 1);
    }
    CHECK(hits == n && misses == n);
    for (size_t i = 0; i < n; i++)
        CHECK(mg_pinned_unregister(AT(start + i * 256)) == MG_OK);
    CHECK(mg_pinned_count() == 0);
}

int main(void) {
    test_seed();
    test_lookup_rules();
    test_real_memory();
    test_against_model();
    test_many_ranges();
    return test_finish();
}
