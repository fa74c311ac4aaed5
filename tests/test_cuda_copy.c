/*
 * test_cuda_copy.c - the CUDA backend's copy paths on a real device (skipped without one):
 * staged host-to-device copies whose source is overwritten and freed right after the call,
 * many small staged copies on two streams, a staged copy behind long-running work returning
 * before that work ends, pinned direct copies, staged device-to-host copies, 2-D copies and
 * memsets with guard bytes around every destination, and the capture rules of the async
 * copies. Random sizes and contents each run; destinations poisoned first.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "test_cuda_util.h"

#define POISON 0xCD
#define GUARD 4096 /* bytes around each destination that must stay poisoned */

static mg_kernel *spin;

/* Device buffer of bytes + 2 * GUARD, poisoned; the usable range starts at GUARD. */
static mg_devptr guarded_alloc(mg_backend *b, size_t bytes) {
    mg_devptr p = 0;
    CHECK_OK(mg_alloc(b, bytes + 2 * GUARD, &p));
    CHECK_OK(mg_memset(b, p, POISON, bytes + 2 * GUARD));
    return p;
}

/* Reads the whole guarded buffer back and checks: guards poisoned, payload == expect. */
static void check_guarded(mg_backend *b, mg_devptr p, const unsigned char *expect, size_t bytes,
                          const char *what) {
    unsigned char *got = malloc(bytes + 2 * GUARD);
    CHECK(got != NULL);
    if (!got)
        return;
    CHECK_OK(mg_copy_d2h(b, got, p, bytes + 2 * GUARD));
    size_t bad_guard = 0, bad_payload = 0;
    for (size_t i = 0; i < GUARD; i++)
        bad_guard += (got[i] != POISON) + (got[GUARD + bytes + i] != POISON);
    for (size_t i = 0; i < bytes; i++)
        bad_payload += got[GUARD + i] != expect[i];
    if (bad_guard || bad_payload)
        fprintf(stderr, "  %s: %zu payload bytes wrong of %zu, %zu guard bytes written\n", what,
                bad_payload, bytes, bad_guard);
    CHECK(bad_guard == 0);
    CHECK(bad_payload == 0);
    free(got);
}

/* A large pageable copy (the ring wraps several times) queued behind 50 ms of work: the
 * source is scribbled over and freed as soon as the call returns. */
static void test_staged_h2d_large(mg_backend *b, mg_stream *s) {
    size_t bytes = ((size_t)37 << 20) + (size_t)test_rand_range(1, 4095);
    unsigned char *src = malloc(bytes), *expect = malloc(bytes);
    CHECK(src && expect);
    if (!src || !expect)
        return;
    test_fill_random(src, bytes);
    memcpy(expect, src, bytes);
    mg_devptr d = guarded_alloc(b, bytes);
    CHECK_OK(cuda_test_spin(b, spin, s, 50 * 1000 * 1000));
    CHECK_OK(mg_copy_h2d_async(b, d + GUARD, src, bytes, s));
    memset(src, 0x11, bytes);
    free(src);
    CHECK_OK(mg_stream_synchronize(s));
    check_guarded(b, d, expect, bytes, "staged h2d, 37 MiB");
    CHECK_OK(mg_free(b, d));
    free(expect);
}

/* Hundreds of small copies of random sizes at random odd offsets, alternating between two
 * streams, each from one host buffer that is rewritten right after every call. */
static void test_staged_h2d_small_many(mg_backend *b, mg_stream *s) {
    size_t bytes = (size_t)6 << 20;
    unsigned char *expect = malloc(bytes), *scratch = malloc(32768);
    CHECK(expect && scratch);
    if (!expect || !scratch)
        return;
    memset(expect, POISON, bytes);
    mg_devptr d = guarded_alloc(b, bytes);
    size_t cursor = 0;
    int copies = 0;
    while (copies < 400) {
        size_t n = (size_t)test_rand_range(1, 20000);
        size_t gap = (size_t)test_rand_range(0, 300);
        if (cursor + gap + n > bytes)
            break;
        cursor += gap;
        test_fill_random(scratch, n);
        memcpy(expect + cursor, scratch, n);
        mg_stream *on = copies % 2 ? s : NULL; /* NULL: the default stream */
        CHECK_OK(mg_copy_h2d_async(b, d + GUARD + cursor, scratch, n, on));
        memset(scratch, 0x22, n);
        cursor += n;
        copies++;
    }
    CHECK_OK(mg_stream_synchronize(s));
    CHECK_OK(mg_stream_synchronize(mg_stream_default(b)));
    printf("  %d small staged copies over %zu bytes\n", copies, cursor);
    check_guarded(b, d, expect, bytes, "small staged h2d copies");
    CHECK_OK(mg_free(b, d));
    free(expect);
    free(scratch);
}

/* Staging never waits for earlier work on the stream (the driver's pageable path would):
 * right after the call, 300 ms of queued work must still be running. */
static void test_staged_h2d_does_not_wait(mg_backend *b, mg_stream *s) {
    unsigned char src[4096];
    test_fill_random(src, sizeof src);
    mg_devptr d = guarded_alloc(b, sizeof src);
    mg_event *spun = NULL;
    CHECK_OK(mg_event_create(b, &spun));
    CHECK_OK(cuda_test_spin(b, spin, s, 300ull * 1000 * 1000));
    CHECK_OK(mg_event_record(spun, s));
    CHECK_OK(mg_copy_h2d_async(b, d + GUARD, src, sizeof src, s));
    CHECK_STATUS(mg_event_query(spun), MG_ERR_NOT_READY);
    unsigned char expect[4096];
    memcpy(expect, src, sizeof src);
    memset(src, 0x33, sizeof src);
    CHECK_OK(mg_stream_synchronize(s));
    CHECK_OK(mg_event_query(spun));
    check_guarded(b, d, expect, sizeof src, "staged h2d behind work");
    CHECK_OK(mg_event_destroy(spun));
    CHECK_OK(mg_free(b, d));
}

static void test_pinned_paths(mg_backend *b, mg_stream *s) {
    size_t bytes = ((size_t)5 << 20) + (size_t)test_rand_range(1, 999);
    unsigned char *pinned = NULL, *expect = malloc(bytes);
    CHECK_OK(mg_host_alloc(b, bytes, (void **)&pinned));
    CHECK(pinned && expect);
    if (!pinned || !expect)
        return;
    size_t nonzero = 0;
    for (size_t i = 0; i < bytes; i++)
        nonzero += pinned[i] != 0;
    CHECK(nonzero == 0); /* mg_host_alloc promises zeroed memory */

    /* retained: direct DMA from the pinned block */
    test_fill_random(pinned, bytes);
    memcpy(expect, pinned, bytes);
    mg_devptr d = guarded_alloc(b, bytes);
    CHECK_OK(mg_copy_h2d_async_retained(b, d + GUARD, pinned, bytes, s));
    CHECK_OK(mg_stream_synchronize(s));
    check_guarded(b, d, expect, bytes, "retained pinned h2d");

    /* not retained: staged even though pinned, so overwriting it right away is safe */
    test_fill_random(pinned, bytes);
    memcpy(expect, pinned, bytes);
    CHECK_OK(cuda_test_spin(b, spin, s, 30 * 1000 * 1000));
    CHECK_OK(mg_copy_h2d_async(b, d + GUARD, pinned, bytes, s));
    memset(pinned, 0x44, bytes);
    CHECK_OK(mg_stream_synchronize(s));
    check_guarded(b, d, expect, bytes, "non-retained pinned h2d");

    /* d2h into pinned memory, async */
    memset(pinned, POISON, bytes);
    CHECK_OK(mg_copy_d2h_async(b, pinned, d + GUARD, bytes, s));
    CHECK_OK(mg_stream_synchronize(s));
    CHECK(memcmp(pinned, expect, bytes) == 0);

    /* a kernel writing through the mapped device address of a pinned block */
    if (mg_backend_supports(b, MG_CAP_HOST_DEVICE_POINTER)) {
        mg_devptr mapped = 0;
        CHECK_OK(mg_host_device_pointer(b, pinned, &mapped));
        CHECK(mapped != 0);
        mg_kernel *fill = cuda_test_kernel(b, "fill_u32");
        uint32_t words = (uint32_t)(bytes / 4) - 1;
        memset(pinned, POISON, bytes);
        CHECK_OK(cuda_test_fill_u32(b, fill, s, mapped, 0xA5A5F00Du, words));
        CHECK_OK(mg_stream_synchronize(s));
        size_t wrong = 0;
        for (uint32_t i = 0; i < words; i++) {
            uint32_t v;
            memcpy(&v, pinned + 4 * (size_t)i, 4);
            wrong += v != 0xA5A5F00Du;
        }
        CHECK(wrong == 0);
        CHECK(pinned[4 * (size_t)words] == POISON);
        mg_kernel_release(fill);
    }
    CHECK_OK(mg_free(b, d));
    CHECK_OK(mg_host_free(b, pinned));
    free(expect);
}

/* Device to pageable memory goes through whole staging slots; larger than the ring. */
static void test_d2h_pageable(mg_backend *b, mg_stream *s) {
    size_t bytes = ((size_t)41 << 20) + (size_t)test_rand_range(1, 4095);
    unsigned char *src = malloc(bytes), *got = malloc(bytes + 2 * GUARD);
    CHECK(src && got);
    if (!src || !got)
        return;
    test_fill_random(src, bytes);
    mg_devptr d = 0;
    CHECK_OK(mg_alloc(b, bytes, &d));
    CHECK_OK(mg_copy_h2d(b, d, src, bytes));
    for (int pass = 0; pass < 2; pass++) {
        memset(got, POISON, bytes + 2 * GUARD);
        if (pass == 0) {
            CHECK_OK(mg_copy_d2h(b, got + GUARD, d, bytes));
        } else {
            CHECK_OK(mg_copy_d2h_async(b, got + GUARD, d, bytes, s));
            CHECK_OK(mg_stream_synchronize(s));
        }
        CHECK(memcmp(got + GUARD, src, bytes) == 0);
        size_t bad_guard = 0;
        for (size_t i = 0; i < GUARD; i++)
            bad_guard += (got[i] != POISON) + (got[GUARD + bytes + i] != POISON);
        CHECK(bad_guard == 0);
    }
    CHECK_OK(mg_free(b, d));
    free(src);
    free(got);
}

static void test_d2d_2d_memset(mg_backend *b, mg_stream *s) {
    size_t bytes = (size_t)test_rand_range(100000, 3000000);
    unsigned char *src = malloc(bytes), *expect = malloc(bytes);
    CHECK(src && expect);
    if (!src || !expect)
        return;
    test_fill_random(src, bytes);
    mg_devptr from = 0;
    CHECK_OK(mg_alloc(b, bytes + 16, &from));
    CHECK_OK(mg_copy_h2d(b, from, src, bytes + 0));
    mg_devptr d = guarded_alloc(b, bytes);
    CHECK_OK(mg_copy_d2d(b, d + GUARD, from, bytes));
    check_guarded(b, d, src, bytes, "blocking d2d");
    CHECK_OK(mg_memset(b, d, POISON, bytes + 2 * GUARD));
    CHECK_OK(mg_copy_d2d_async(b, d + GUARD, from, bytes, s));
    CHECK_OK(mg_stream_synchronize(s));
    check_guarded(b, d, src, bytes, "async d2d");

    /* 2-D: `height` rows of `width` bytes between different pitches */
    size_t width = (size_t)test_rand_range(1, 900), height = (size_t)test_rand_range(1, 60);
    size_t src_pitch = width + (size_t)test_rand_range(0, 200);
    size_t dst_pitch = width + (size_t)test_rand_range(0, 300);
    if (src_pitch * height <= bytes) {
        size_t span = dst_pitch * (height - 1) + width;
        memset(expect, POISON, span);
        for (size_t r = 0; r < height; r++)
            memcpy(expect + r * dst_pitch, src + r * src_pitch, width);
        CHECK_OK(mg_memset(b, d, POISON, bytes + 2 * GUARD));
        CHECK_OK(mg_copy_2d_d2d_async(b, d + GUARD, dst_pitch, from, src_pitch, width, height, s));
        CHECK_OK(mg_stream_synchronize(s));
        check_guarded(b, d, expect, span, "2-D d2d");
    }

    /* memsets on an odd interior range, blocking and async */
    size_t off = (size_t)test_rand_range(1, 999), n = (size_t)test_rand_range(1, bytes - off);
    memset(expect, POISON, bytes);
    memset(expect + off, 0x3C, n);
    CHECK_OK(mg_memset(b, d, POISON, bytes + 2 * GUARD));
    CHECK_OK(mg_memset(b, d + GUARD + off, 0x3C, n));
    check_guarded(b, d, expect, bytes, "blocking memset");
    memset(expect + off, 0x7E, n);
    CHECK_OK(mg_memset_async(b, d + GUARD + off, 0x7E, n, s));
    CHECK_OK(mg_stream_synchronize(s));
    check_guarded(b, d, expect, bytes, "async memset");

    CHECK_OK(mg_free(b, d));
    CHECK_OK(mg_free(b, from));
    free(src);
    free(expect);
}

/* During a capture, copies that would stage are refused with a message that says what to
 * do instead; the refusal leaves the capture intact, and a retained pinned copy records. */
static void test_capture_rules(mg_backend *b, mg_stream *s) {
    size_t bytes = 65536 + (size_t)test_rand_range(1, 999);
    unsigned char *pageable = malloc(bytes), *pinned = NULL, *expect = malloc(bytes);
    CHECK_OK(mg_host_alloc(b, bytes, (void **)&pinned));
    CHECK(pageable && pinned && expect);
    if (!pageable || !pinned || !expect)
        return;
    test_fill_random(pageable, bytes);
    mg_devptr d = guarded_alloc(b, bytes);

    CHECK_OK(mg_graph_begin_capture(s));
    CHECK_STATUS(mg_copy_h2d_async(b, d + GUARD, pageable, bytes, s), MG_ERR_CAPTURING);
    CHECK_MESSAGE("mg_copy_h2d_async_retained");
    CHECK_STATUS(mg_copy_h2d_async_retained(b, d + GUARD, pageable, bytes, s), MG_ERR_CAPTURING);
    CHECK_MESSAGE("page-locked");
    CHECK_STATUS(mg_copy_d2h_async(b, pageable, d + GUARD, bytes, s), MG_ERR_CAPTURING);
    CHECK_MESSAGE("page-locked");
    CHECK_STATUS(mg_copy_h2d(b, d + GUARD, pageable, bytes), MG_ERR_CAPTURING);
    CHECK_OK(mg_copy_h2d_async_retained(b, d + GUARD, pinned, bytes, s));
    mg_graph *g = NULL;
    CHECK_OK(mg_graph_end_capture(s, &g));

    /* Nothing ran during the capture; each replay copies the pinned block as it is then. */
    check_guarded(b, d, (const unsigned char *)memset(expect, POISON, bytes), bytes,
                  "captured copy did not run yet");
    for (int replay = 0; replay < 3 && g; replay++) {
        test_fill_random(pinned, bytes);
        memcpy(expect, pinned, bytes);
        CHECK_OK(mg_graph_launch(g, s));
        CHECK_OK(mg_stream_synchronize(s));
        check_guarded(b, d, expect, bytes, "replayed pinned copy");
    }
    CHECK_OK(mg_graph_destroy(g));

    /* An aborted capture leaves the stream usable. */
    CHECK_OK(mg_graph_begin_capture(s));
    CHECK_OK(mg_graph_abort_capture(s));
    CHECK_OK(mg_copy_h2d_async(b, d + GUARD, pageable, bytes, s));
    CHECK_OK(mg_stream_synchronize(s));
    check_guarded(b, d, pageable, bytes, "copy after an aborted capture");

    CHECK_OK(mg_free(b, d));
    CHECK_OK(mg_host_free(b, pinned));
    free(pageable);
    free(expect);
}

static void test_memory_queries(mg_backend *b) {
    mg_device_info info;
    CHECK_OK(mg_device_get_info(b, &info));
    uint64_t free_bytes = 0, total = 0, device_free = 0;
    CHECK_OK(mg_memory_free_bytes(b, &free_bytes, &total));
    CHECK_OK(mg_memory_device_free_bytes(b, &device_free));
    CHECK(total > 0 && free_bytes > 0 && device_free > 0);
    CHECK(device_free <= total);
    CHECK(info.integrated || free_bytes <= total);
    CHECK(info.multiprocessors > 0 && info.cc_major >= 8);
    CHECK(info.total_bytes >= total - total / 100 && info.total_bytes <= total + total / 100);
    CHECK(info.max_shared_per_block_optin >= 48 * 1024);

    /* An impossible allocation fails cleanly and says how much was asked. */
    mg_devptr p = 0;
    CHECK_STATUS(mg_alloc(b, (size_t)1 << 50, &p), MG_ERR_OUT_OF_MEMORY);
    CHECK_MESSAGE("cuMemAlloc");
    CHECK_MESSAGE("requested");
    CHECK(p == 0);
}

int main(void) {
    test_seed();
    mg_backend *b = cuda_test_open_or_skip("test_cuda_copy");
    spin = cuda_test_kernel(b, "spin_kernel");
    mg_stream *s = NULL;
    CHECK_OK(mg_stream_create(b, &s));
    if (spin && s) {
        test_staged_h2d_large(b, s);
        test_staged_h2d_small_many(b, s);
        test_staged_h2d_does_not_wait(b, s);
        test_pinned_paths(b, s);
        test_d2h_pageable(b, s);
        test_d2d_2d_memset(b, s);
        test_capture_rules(b, s);
        test_memory_queries(b);
    }
    uint64_t live_bytes = 1, live_count = 1;
    CHECK_OK(mg_ledger_live(b, &live_bytes, &live_count));
    CHECK(live_count == 0);
    CHECK_OK(mg_stream_destroy(s));
    if (spin)
        CHECK_OK(mg_kernel_release(spin));
    CHECK_OK(mg_backend_close(b));
    return test_finish();
}
