/* test_bad_input.c - every kind of bad input the public API can be given, on the CPU
 * backend: null and foreign handles, zero and huge sizes, misaligned, unallocated and
 * overrunning pointers, double free, use after free, blocking calls inside a capture, and
 * destroying what is in use. Each case asserts the status, that the message names the
 * problem, and that nothing outside (or, for a refused call, inside) the destination
 * changed: every destination sits between poisoned guard bytes that are read back. */
#include <stdint.h>

#include "metrale/gpu.h"
#include "metrale/launch.h"
#include "test_util.h"

#define GUARD 64

/* A device allocation of GUARD + bytes + GUARD random bytes with a host copy of what it
 * must still hold; `dst` is its middle. */
typedef struct zone {
    mg_backend *b;
    mg_devptr base, dst;
    size_t bytes;
    uint8_t *image;
} zone;

static zone zone_make(mg_backend *b, size_t bytes) {
    zone z = {.b = b, .bytes = bytes};
    z.image = malloc(bytes + 2 * GUARD);
    test_fill_random(z.image, bytes + 2 * GUARD);
    CHECK_OK(mg_alloc(b, bytes + 2 * GUARD, &z.base));
    CHECK_OK(mg_copy_h2d(b, z.base, z.image, bytes + 2 * GUARD));
    z.dst = z.base + GUARD;
    return z;
}

/* The whole allocation, guards included, still holds what it held. */
#define CHECK_ZONE_UNCHANGED(z)                                                                    \
    do {                                                                                           \
        uint8_t *now_ = malloc((z).bytes + 2 * GUARD);                                             \
        CHECK_OK(mg_copy_d2h((z).b, now_, (z).base, (z).bytes + 2 * GUARD));                       \
        CHECK(memcmp(now_, (z).image, (z).bytes + 2 * GUARD) == 0);                                \
        free(now_);                                                                                \
    } while (0)

static void zone_free(zone *z) {
    CHECK_OK(mg_free(z->b, z->base));
    free(z->image);
}

/* A bad call: the status, a message naming the problem, and the zone untouched. */
#define CHECK_REFUSED(expr, status, needle, z)                                                     \
    do {                                                                                           \
        mg_clear_error();                                                                          \
        CHECK_STATUS(expr, status);                                                                \
        CHECK_MESSAGE(needle);                                                                     \
        CHECK_ZONE_UNCHANGED(z);                                                                   \
    } while (0)

/* The argument list of metrale:vector_add(a, b, out, n) on one block of 64 threads. */
static void vector_add_launch(mg_launch *l, mg_devptr a, mg_devptr b, mg_devptr out, uint32_t n) {
    mg_launch_init(l, (mg_dim3){1, 1, 1}, (mg_dim3){64, 1, 1}, 0);
    mg_launch_arg_ptr(l, a);
    mg_launch_arg_ptr(l, b);
    mg_launch_arg_ptr(l, out);
    mg_launch_arg_u32(l, n);
}

static void test_null_handles(mg_backend *b) {
    zone z = zone_make(b, 100);
    uint8_t host[100] = {0};
    mg_devptr p = 0;
    mg_stream *s = NULL;
    mg_event *e = NULL;
    mg_graph *g = NULL;
    mg_kernel *k = NULL;
    mg_launch l;
    mg_launch_init(&l, (mg_dim3){1, 1, 1}, (mg_dim3){1, 1, 1}, 0);

    CHECK_REFUSED(mg_alloc(NULL, 64, &p), MG_ERR_INVALID_ARGUMENT, "NULL backend", z);
    CHECK_REFUSED(mg_copy_h2d(NULL, z.dst, host, 10), MG_ERR_INVALID_ARGUMENT, "NULL backend", z);
    CHECK_REFUSED(mg_memset_async(NULL, z.dst, 0, 10, NULL), MG_ERR_INVALID_ARGUMENT,
                  "NULL backend", z);
    CHECK_REFUSED(mg_stream_create(NULL, &s), MG_ERR_INVALID_ARGUMENT, "NULL backend", z);
    CHECK_REFUSED(mg_stream_synchronize(NULL), MG_ERR_INVALID_ARGUMENT, "NULL stream", z);
    CHECK_REFUSED(mg_event_record(NULL, NULL), MG_ERR_INVALID_ARGUMENT, "NULL event", z);
    CHECK_REFUSED(mg_event_query(NULL), MG_ERR_INVALID_ARGUMENT, "NULL event", z);
    CHECK_REFUSED(mg_graph_launch(NULL, NULL), MG_ERR_INVALID_ARGUMENT, "NULL graph", z);
    CHECK_REFUSED(mg_graph_begin_capture(NULL), MG_ERR_INVALID_ARGUMENT, "NULL stream", z);
    CHECK_REFUSED(mg_launch_run(b, NULL, NULL, &l), MG_ERR_INVALID_ARGUMENT, "kernel", z);
    CHECK_REFUSED(mg_kernel_release(NULL), MG_ERR_INVALID_ARGUMENT, "NULL kernel", z);
    CHECK_REFUSED(mg_kernel_lookup(b, NULL, "vector_add", &k), MG_ERR_INVALID_ARGUMENT,
                  "empty module name", z);
    CHECK_REFUSED(mg_kernel_lookup(b, "metrale", "", &k), MG_ERR_INVALID_ARGUMENT,
                  "empty function name", z);
    CHECK_REFUSED(mg_alloc(b, 64, NULL), MG_ERR_INVALID_ARGUMENT, "NULL output", z);
    CHECK_REFUSED(mg_device_get_info(b, NULL), MG_ERR_INVALID_ARGUMENT, "NULL output", z);
    CHECK_REFUSED(mg_event_create(b, NULL), MG_ERR_INVALID_ARGUMENT, "NULL output", z);
    CHECK_REFUSED(mg_copy_h2d(b, z.dst, NULL, 10), MG_ERR_INVALID_ARGUMENT, "NULL host pointer", z);
    CHECK_REFUSED(mg_copy_d2h(b, NULL, z.dst, 10), MG_ERR_INVALID_ARGUMENT, "NULL host pointer", z);
    CHECK_REFUSED(mg_copy_h2d(b, 0, host, 10), MG_ERR_INVALID_ARGUMENT, "NULL device pointer", z);
    CHECK_REFUSED(mg_memset(b, 0, 0, 10), MG_ERR_INVALID_ARGUMENT, "NULL device pointer", z);
    CHECK(mg_stream_default(NULL) == NULL);
    CHECK(!mg_backend_supports(NULL, MG_CAP_GRAPHS));
    /* NULL is a no-op where the header says so. */
    CHECK_OK(mg_stream_destroy(NULL));
    CHECK_OK(mg_event_destroy(NULL));
    CHECK_OK(mg_graph_destroy(NULL));
    CHECK_OK(mg_free(b, 0));
    CHECK_OK(mg_host_free(b, NULL));
    CHECK_OK(mg_backend_close(NULL));
    (void)e;
    (void)g;
    zone_free(&z);
}

/* Handles of one CPU backend given to another. */
static void test_foreign_handles(mg_backend *b, mg_backend *other) {
    zone z = zone_make(b, 256);
    zone theirs = zone_make(other, 256);
    uint8_t host[256];
    test_fill_random(host, sizeof host);
    mg_stream *s = NULL, *s_other = NULL;
    mg_event *e = NULL, *e_other = NULL;
    mg_graph *g_other = NULL;
    mg_kernel *k_other = NULL;
    CHECK_OK(mg_stream_create(b, &s));
    CHECK_OK(mg_stream_create(other, &s_other));
    CHECK_OK(mg_event_create(b, &e));
    CHECK_OK(mg_event_create(other, &e_other));
    CHECK_OK(mg_graph_begin_capture(s_other));
    CHECK_OK(mg_memset_async(other, theirs.dst, 0, 16, s_other));
    CHECK_OK(mg_graph_end_capture(s_other, &g_other));
    CHECK_OK(mg_kernel_lookup(other, "metrale", "vector_add", &k_other));

    CHECK_REFUSED(mg_copy_h2d_async(b, z.dst, host, 256, s_other), MG_ERR_INVALID_ARGUMENT,
                  "belongs to another backend", z);
    CHECK_REFUSED(mg_memset_async(b, z.dst, 1, 256, s_other), MG_ERR_INVALID_ARGUMENT,
                  "belongs to another backend", z);
    CHECK_REFUSED(mg_event_record(e_other, s), MG_ERR_INVALID_ARGUMENT, "another backend", z);
    CHECK_REFUSED(mg_stream_wait_event(s, e_other), MG_ERR_INVALID_ARGUMENT, "different backends",
                  z);
    float ms;
    CHECK_REFUSED(mg_event_elapsed_ms(e, e_other, &ms), MG_ERR_INVALID_ARGUMENT,
                  "different backends", z);
    CHECK_REFUSED(mg_graph_launch(g_other, s), MG_ERR_INVALID_ARGUMENT, "another backend", z);
    CHECK_ZONE_UNCHANGED(theirs); /* the other backend's graph did not run either */
    mg_launch l;
    vector_add_launch(&l, z.dst, z.dst, z.dst, 64);
    CHECK_REFUSED(mg_launch_run(b, k_other, s, &l), MG_ERR_INVALID_ARGUMENT, "another backend", z);
    /* Memory of the other backend is not this backend's. */
    CHECK_REFUSED(mg_copy_h2d(b, theirs.dst, host, 16), MG_ERR_INVALID_ARGUMENT,
                  "not inside any live allocation", z);
    CHECK_ZONE_UNCHANGED(theirs);
    CHECK_REFUSED(mg_free(b, theirs.base), MG_ERR_INVALID_ARGUMENT, "not a live allocation", z);
    CHECK_ZONE_UNCHANGED(theirs); /* still allocated and intact */
    /* Updating another backend's graph ends the capture instead of leaving it open. */
    CHECK_OK(mg_graph_begin_capture(s));
    bool in_place = true, capturing = true;
    CHECK_REFUSED(mg_graph_end_capture_update(s, g_other, &in_place), MG_ERR_INVALID_ARGUMENT,
                  "another backend", z);
    CHECK_OK(mg_stream_is_capturing(s, &capturing));
    CHECK(!capturing);

    mg_kernel_release(k_other);
    CHECK_OK(mg_graph_destroy(g_other));
    CHECK_OK(mg_event_destroy(e));
    CHECK_OK(mg_event_destroy(e_other));
    CHECK_OK(mg_stream_destroy(s));
    CHECK_OK(mg_stream_destroy(s_other));
    zone_free(&z);
    zone_free(&theirs);
}

static void test_sizes(mg_backend *b) {
    zone z = zone_make(b, 100);
    mg_devptr p = 0;
    void *h = NULL;
    CHECK_REFUSED(mg_alloc(b, 0, &p), MG_ERR_INVALID_ARGUMENT, "zero bytes", z);
    CHECK(p == 0);
    CHECK_REFUSED(mg_host_alloc(b, 0, &h), MG_ERR_INVALID_ARGUMENT, "zero bytes", z);
    CHECK(h == NULL);
    /* Huge: out of memory, and the message names the size and the caller. */
    CHECK_REFUSED(mg_alloc(b, (size_t)1 << 50, &p), MG_ERR_OUT_OF_MEMORY, "1.0 PiB", z);
    CHECK_MESSAGE("1125899906842624 bytes");
    CHECK_MESSAGE("test_bad_input.c");
    CHECK(p == 0);
    CHECK_REFUSED(mg_alloc(b, SIZE_MAX, &p), MG_ERR_OUT_OF_MEMORY, "18446744073709551615", z);
    CHECK_REFUSED(mg_alloc_managed(b, SIZE_MAX - 100, &p), MG_ERR_OUT_OF_MEMORY,
                  "18446744073709551515", z);
    CHECK_REFUSED(mg_host_alloc(b, (size_t)1 << 50, &h), MG_ERR_OUT_OF_MEMORY, "1125899906842624",
                  z);
    CHECK(h == NULL);
    CHECK_REFUSED(mg_alloc_at(b, 64, (mg_alloc_kind)7, &p, __FILE__, __LINE__),
                  MG_ERR_INVALID_ARGUMENT, "unknown kind 7", z);
    /* Sizes that wrap the address space. */
    uint8_t host[8] = {0};
    CHECK_REFUSED(mg_copy_h2d(b, z.dst, host, SIZE_MAX), MG_ERR_INVALID_ARGUMENT, "wraps", z);
    CHECK_REFUSED(mg_copy_2d_d2d_async(b, z.dst, SIZE_MAX / 2, z.dst, SIZE_MAX / 2, 1, 4, NULL),
                  MG_ERR_INVALID_ARGUMENT, "overflow", z);
    uint64_t live, count;
    CHECK_OK(mg_ledger_live(b, &live, &count));
    CHECK(count == 1); /* only the zone: no failed allocation was recorded */
    zone_free(&z);
}

static void test_pointers(mg_backend *b) {
    zone z = zone_make(b, 1000);
    zone src = zone_make(b, 1000);
    uint8_t host[1100];
    test_fill_random(host, sizeof host);
    mg_stream *s = NULL;
    CHECK_OK(mg_stream_create(b, &s));

    /* Unallocated addresses. */
    const mg_devptr nowhere = 0x1000;
    CHECK_REFUSED(mg_copy_h2d(b, nowhere, host, 16), MG_ERR_INVALID_ARGUMENT,
                  "not inside any live allocation", z);
    CHECK_REFUSED(mg_copy_d2h(b, host, nowhere, 16), MG_ERR_INVALID_ARGUMENT,
                  "not inside any live allocation", z);
    CHECK_REFUSED(mg_copy_d2d_async(b, z.dst, nowhere, 16, s), MG_ERR_INVALID_ARGUMENT, "0x1000",
                  z);
    CHECK_REFUSED(mg_memset_async(b, nowhere, 0, 16, s), MG_ERR_INVALID_ARGUMENT,
                  "not inside any live allocation", z);
    /* Overruns: starting inside, ending past the allocation (by one byte). */
    size_t whole = z.bytes + 2 * GUARD;
    CHECK_REFUSED(mg_copy_h2d(b, z.base, host, whole + 1), MG_ERR_INVALID_ARGUMENT,
                  "overruns its allocation", z);
    CHECK_MESSAGE("by 1 bytes");
    CHECK_REFUSED(mg_copy_h2d_async(b, z.base + 100, host, whole - 99, s), MG_ERR_INVALID_ARGUMENT,
                  "overruns", z);
    CHECK_REFUSED(mg_copy_d2d(b, z.dst, src.base + 200, whole - 199), MG_ERR_INVALID_ARGUMENT,
                  "source", z);
    CHECK_REFUSED(mg_memset(b, z.base + whole - 4, 0, 5), MG_ERR_INVALID_ARGUMENT, "overruns", z);
    CHECK_REFUSED(mg_copy_d2h_async(b, host, z.base + 1, whole, s), MG_ERR_INVALID_ARGUMENT,
                  "overruns", z);
    /* 2-D: the last row runs past the end; pitch below width. */
    CHECK_REFUSED(mg_copy_2d_d2d_async(b, z.base, 100, src.base, 100, 80, 12, s),
                  MG_ERR_INVALID_ARGUMENT, "overruns", z);
    CHECK_REFUSED(mg_copy_2d_d2d_async(b, z.base, 10, src.base, 100, 20, 2, s),
                  MG_ERR_INVALID_ARGUMENT, "pitch", z);
    /* Misaligned and interior frees. */
    CHECK_REFUSED(mg_free(b, z.base + 1), MG_ERR_INVALID_ARGUMENT, "interior pointer", z);
    CHECK_REFUSED(mg_free(b, z.base + whole - 1), MG_ERR_INVALID_ARGUMENT, "interior pointer", z);
    void *h = NULL;
    CHECK_OK(mg_host_alloc(b, 256, &h));
    CHECK_REFUSED(mg_host_free(b, (char *)h + 1), MG_ERR_INVALID_ARGUMENT,
                  "not returned by mg_host_alloc", z);
    CHECK_REFUSED(mg_host_free(b, host), MG_ERR_INVALID_ARGUMENT, "not returned by mg_host_alloc",
                  z);
    mg_devptr dp = 0;
    CHECK_REFUSED(mg_host_device_pointer(b, host, &dp), MG_ERR_INVALID_ARGUMENT,
                  "not a live block from mg_host_alloc", z);
    CHECK_OK(mg_host_free(b, h));
    /* A misaligned float buffer for a kernel is refused before it runs (a GPU would fault). */
    mg_kernel *k = NULL;
    CHECK_OK(mg_kernel_lookup(b, "metrale", "vector_add", &k));
    mg_launch l;
    vector_add_launch(&l, src.dst, src.dst, z.dst + 2, 16);
    CHECK_REFUSED(mg_launch_run(b, k, s, &l), MG_ERR_INVALID_ARGUMENT, "misaligned", z);
    /* ... and so is one that runs past its buffer. */
    vector_add_launch(&l, src.dst, src.dst, z.dst, (uint32_t)(z.bytes / 4 + GUARD / 4 + 1));
    CHECK_REFUSED(mg_launch_run(b, k, s, &l), MG_ERR_INVALID_ARGUMENT, "overrun", z);
    /* Launch builder and configuration errors. */
    mg_launch_clear_args(&l);
    for (int i = 0; i < MG_LAUNCH_MAX_ARGS + 1; i++)
        mg_launch_arg_u32(&l, 1);
    CHECK_REFUSED(mg_launch_run(b, k, s, &l), MG_ERR_INVALID_ARGUMENT, "argument list", z);
    CHECK_MESSAGE("is invalid");
    mg_launch_init(&l, (mg_dim3){0, 1, 1}, (mg_dim3){64, 1, 1}, 0);
    CHECK_REFUSED(mg_launch_run(b, k, s, &l), MG_ERR_INVALID_ARGUMENT, "empty grid", z);
    mg_launch_init(&l, (mg_dim3){1, 1, 1}, (mg_dim3){64, 1, 1}, 1u << 20);
    CHECK_REFUSED(mg_launch_run(b, k, s, &l), MG_ERR_INVALID_ARGUMENT, "shared memory", z);
    mg_kernel_release(k);
    CHECK_OK(mg_stream_destroy(s));
    zone_free(&z);
    zone_free(&src);
}

static void test_free_errors(mg_backend *b) {
    zone z = zone_make(b, 64);
    mg_devptr p = 0;
    uint8_t host[64];
    test_fill_random(host, sizeof host);
    CHECK_OK(mg_alloc(b, 512, &p));
    CHECK_OK(mg_free(b, p));
    CHECK_REFUSED(mg_free(b, p), MG_ERR_INVALID_ARGUMENT, "already freed", z); /* double free */
    /* Use after free. */
    CHECK_REFUSED(mg_copy_h2d(b, p, host, 64), MG_ERR_INVALID_ARGUMENT, "already freed", z);
    CHECK_REFUSED(mg_copy_d2d(b, z.dst, p, 64), MG_ERR_INVALID_ARGUMENT, "already freed", z);
    CHECK_REFUSED(mg_memset_async(b, p, 0, 64, NULL), MG_ERR_INVALID_ARGUMENT, "already freed", z);
    /* A graph that captured the freed buffer fails on replay instead of writing to it. */
    mg_devptr q = 0;
    mg_stream *s = NULL;
    mg_graph *g = NULL;
    CHECK_OK(mg_alloc(b, 64, &q));
    CHECK_OK(mg_stream_create(b, &s));
    CHECK_OK(mg_graph_begin_capture(s));
    CHECK_OK(mg_copy_d2d_async(b, z.dst, q, 64, s));
    CHECK_OK(mg_graph_end_capture(s, &g));
    CHECK_OK(mg_free(b, q));
    CHECK_REFUSED(mg_graph_launch(g, s), MG_ERR_INVALID_ARGUMENT, "not inside any live allocation",
                  z);
    CHECK_MESSAGE("graph node 1 of 1");
    /* A kernel given a freed buffer. */
    mg_kernel *k = NULL;
    CHECK_OK(mg_kernel_lookup(b, "metrale", "vector_add", &k));
    mg_launch l;
    vector_add_launch(&l, p, p, z.dst, 16);
    CHECK_REFUSED(mg_launch_run(b, k, s, &l), MG_ERR_INVALID_ARGUMENT,
                  "not inside any live allocation", z);
    CHECK_OK(mg_kernel_release(k));
    CHECK_REFUSED(mg_kernel_release(k), MG_ERR_INVALID_ARGUMENT, "no outstanding lookup", z);
    CHECK_OK(mg_graph_destroy(g));
    CHECK_OK(mg_stream_destroy(s));
    zone_free(&z);
}

/* What a capture refuses, and what "in use" prevents. */
static void test_capture_and_in_use(mg_backend *b) {
    zone z = zone_make(b, 128);
    uint8_t host[128];
    test_fill_random(host, sizeof host);
    mg_stream *s = NULL, *other = NULL;
    mg_graph *g = NULL;
    mg_event *e = NULL;
    mg_devptr p = 0;
    void *h = NULL;
    CHECK_OK(mg_stream_create(b, &s));
    CHECK_OK(mg_stream_create(b, &other));
    CHECK_OK(mg_event_create(b, &e));
    CHECK_OK(mg_graph_begin_capture(s));
    CHECK_OK(mg_memset_async(b, z.dst, 0x55, 128, s)); /* recorded, not run */
    CHECK_OK(mg_event_record(e, s));
    /* While capturing, the zone can only be read back after the capture ends (a blocking
     * read is refused too): each refusal is checked for status and message here. */
#define CHECK_CAPTURING(expr)                                                                      \
    do {                                                                                           \
        mg_clear_error();                                                                          \
        CHECK_STATUS(expr, MG_ERR_CAPTURING);                                                      \
        CHECK_MESSAGE("capturing");                                                                \
    } while (0)
    CHECK_CAPTURING(mg_stream_synchronize(s));
    CHECK_CAPTURING(mg_alloc(b, 64, &p));
    CHECK_CAPTURING(mg_host_alloc(b, 64, &h));
    CHECK_CAPTURING(mg_copy_h2d(b, z.dst, host, 128));
    CHECK_CAPTURING(mg_copy_d2h(b, host, z.dst, 128));
    CHECK_CAPTURING(mg_memset(b, z.dst, 0, 128));
    CHECK_CAPTURING(mg_stream_destroy(s));
    CHECK_CAPTURING(mg_graph_begin_capture(s));
    CHECK_MESSAGE("already capturing");
#undef CHECK_CAPTURING
    CHECK(p == 0 && h == NULL);
    /* Another stream of the backend still runs work (it is not capturing). */
    CHECK_OK(mg_memset_async(b, z.dst + 127, 0x66, 1, other));
    CHECK_OK(mg_stream_synchronize(other));
    z.image[GUARD + 127] = 0x66;
    CHECK_OK(mg_graph_end_capture(s, &g));
    CHECK_ZONE_UNCHANGED(z); /* the captured memset has not run */
    /* The event the graph records into can be destroyed; the graph still runs. */
    CHECK_OK(mg_event_destroy(e));
    CHECK_OK(mg_graph_launch(g, s));
    CHECK_OK(mg_stream_synchronize(s));
    memset(z.image + GUARD, 0x55, 128);
    CHECK_ZONE_UNCHANGED(z);
    /* Ending or aborting without a capture. */
    mg_graph *none = NULL;
    CHECK_REFUSED(mg_graph_end_capture(s, &none), MG_ERR_INVALID_ARGUMENT, "not capturing", z);
    CHECK(none == NULL);
    CHECK_REFUSED(mg_graph_abort_capture(s), MG_ERR_INVALID_ARGUMENT, "not capturing", z);
    /* The default stream is the backend's. */
    CHECK_REFUSED(mg_stream_destroy(mg_stream_default(b)), MG_ERR_INVALID_ARGUMENT,
                  "default stream", z);
    /* Destroyed handles are recognised as such. */
    CHECK_OK(mg_stream_destroy(other));
    CHECK_REFUSED(mg_stream_synchronize(other), MG_ERR_INVALID_ARGUMENT, "destroyed", z);
    CHECK_REFUSED(mg_event_query(e), MG_ERR_INVALID_ARGUMENT, "destroyed", z);
    CHECK_OK(mg_graph_destroy(g));
    CHECK_REFUSED(mg_graph_launch(g, s), MG_ERR_INVALID_ARGUMENT, "destroyed", z);
    /* A capture left open is abandoned by mg_backend_close (checked by the caller's close). */
    CHECK_OK(mg_graph_begin_capture(s));
    CHECK_OK(mg_memset_async(b, z.dst, 0, 128, s));
    zone_free(&z);
    (void)s; /* still capturing, closed with the backend */
}

static void test_open_errors(void) {
    mg_backend *b = NULL;
    mg_backend_kind kind;
    CHECK_STATUS(mg_backend_open(MG_BACKEND_CPU, 8, &b), MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("device 8 out of range");
    CHECK(b == NULL);
    CHECK_STATUS(mg_backend_open(MG_BACKEND_CPU, -1, &b), MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("negative");
    CHECK_STATUS(mg_backend_open((mg_backend_kind)42, 0, &b), MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("unknown backend kind 42");
    CHECK_STATUS(mg_backend_open(MG_BACKEND_CPU, 0, NULL), MG_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(mg_backend_kind_parse("gpu", &kind), MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("'gpu'");
    mg_backend_probe probe;
    CHECK_STATUS(mg_backend_probe_kind(MG_BACKEND_AUTO, &probe), MG_ERR_INVALID_ARGUMENT);
}

int main(void) {
    test_seed();
    mg_backend *b = NULL, *other = NULL;
    CHECK_OK(mg_backend_open(MG_BACKEND_CPU, 4, &b));
    CHECK_OK(mg_backend_open(MG_BACKEND_CPU, 5, &other));
    if (!b || !other)
        return test_finish();
    CHECK_STATUS(mg_backend_open(MG_BACKEND_CPU, 4, &(mg_backend *){NULL}), MG_ERR_BUSY);
    CHECK_MESSAGE("already open");
    test_null_handles(b);
    test_foreign_handles(b, other);
    test_sizes(b);
    test_pointers(b);
    test_free_errors(b);
    test_capture_and_in_use(b);
    test_open_errors();
    CHECK_OK(mg_backend_close(other));
    CHECK_OK(mg_backend_close(b));
    /* A closed backend is an invalid handle, not a crash. */
    mg_devptr p = 0;
    CHECK_STATUS(mg_alloc(b, 64, &p), MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("invalid or closed");
    return test_finish();
}
