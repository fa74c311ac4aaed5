/* conformance.c - the backend conformance suite: every call of metrale/gpu.h on any backend,
 * through the public API only.
 *
 * Each check uses fresh random data (seeded from the run's seed and the check's name),
 * awkward sizes, destinations poisoned with random bytes, and guard bytes around every
 * destination that must come back unchanged. Checks free what they allocate, so the suite
 * can run on a backend that holds other allocations (only the sweep check needs an empty
 * ledger and skips otherwise). Everything here is valid on a GPU: host memory that a
 * captured copy touches comes from mg_host_alloc, kernel buffers are 256-byte aligned.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#include "check.h"
#include "check_util.h"
#include "metrale/launch.h"

/* ------------------------------------------------------------------ small framework */

static void rng_fill(uint64_t *r, void *dst, size_t bytes) {
    uint8_t *p = dst;
    for (size_t i = 0; i < bytes; i++)
        p[i] = (uint8_t)(mg_check_rng_next(r) >> 56);
}

/* Uniform in [-1, 1). */
static float rng_float(uint64_t *r) {
    return (float)((double)(mg_check_rng_next(r) >> 40) / (double)(1ull << 23) - 1.0);
}

static void rng_floats(uint64_t *r, float *dst, size_t n) {
    for (size_t i = 0; i < n; i++)
        dst[i] = rng_float(r);
}

/* Offset of the first differing byte, or SIZE_MAX when equal. */
static size_t first_difference(const void *a, const void *b, size_t bytes) {
    const uint8_t *pa = a, *pb = b;
    for (size_t i = 0; i < bytes; i++)
        if (pa[i] != pb[i])
            return i;
    return SIZE_MAX;
}

/* A device allocation of `guard + bytes + guard`, all poisoned with random bytes; `dst` is
 * the payload in the middle. `image` is the host image of what the whole allocation must
 * hold; a check updates the payload part of it and verifies with guarded_verify. */
typedef struct guarded {
    mg_devptr base, dst;
    size_t bytes, guard;
    uint8_t *image;
} guarded;

static mg_status guarded_alloc(mg_backend *b, uint64_t *r, size_t bytes, size_t guard, guarded *g) {
    *g = (guarded){0};
    size_t total = bytes + 2 * guard;
    g->image = malloc(total);
    if (!g->image)
        return MG_ERR_OUT_OF_MEMORY;
    rng_fill(r, g->image, total);
    mg_status st = mg_alloc(b, total, &g->base);
    if (!st)
        st = mg_copy_h2d(b, g->base, g->image, total);
    g->dst = g->base + guard;
    g->bytes = bytes;
    g->guard = guard;
    return st;
}

static uint8_t *guarded_payload(guarded *g) {
    return g->image + g->guard;
}

/* Reads the whole allocation back; false with `why` filled when any byte differs from the
 * image (guard bytes included). */
static bool guarded_verify(mg_backend *b, const guarded *g, char *why, size_t why_bytes) {
    size_t total = g->bytes + 2 * g->guard;
    uint8_t *got = malloc(total);
    if (!got) {
        snprintf(why, why_bytes, "out of host memory");
        return false;
    }
    mg_status st = mg_copy_d2h(b, got, g->base, total);
    size_t at = st ? 0 : first_difference(got, g->image, total);
    bool ok = !st && at == SIZE_MAX;
    if (st)
        snprintf(why, why_bytes, "read-back failed: %s: %s", mg_status_name(st), mg_last_error());
    else if (!ok)
        snprintf(why, why_bytes,
                 "byte %zd relative to the destination is 0x%02x, expected 0x%02x (%s)",
                 (ssize_t)at - (ssize_t)g->guard, got[at], g->image[at],
                 at < g->guard || at >= g->guard + g->bytes ? "guard byte overwritten"
                                                            : "wrong payload");
    free(got);
    return ok;
}

static void guarded_free(mg_backend *b, guarded *g) {
    if (g->base)
        mg_free(b, g->base);
    free(g->image);
    *g = (guarded){0};
}

/* A host buffer with poisoned guards on both sides, for d2h destinations. */
typedef struct host_guarded {
    uint8_t *whole, *dst, *image;
    size_t bytes, guard;
} host_guarded;

static bool host_guarded_alloc(uint64_t *r, size_t bytes, size_t guard, host_guarded *h) {
    *h = (host_guarded){0};
    h->whole = malloc(bytes + 2 * guard);
    h->image = malloc(bytes + 2 * guard);
    if (!h->whole || !h->image)
        return false;
    rng_fill(r, h->image, bytes + 2 * guard);
    memcpy(h->whole, h->image, bytes + 2 * guard);
    h->dst = h->whole + guard;
    h->bytes = bytes;
    h->guard = guard;
    return true;
}

static bool host_guarded_verify(const host_guarded *h, char *why, size_t why_bytes) {
    size_t at = first_difference(h->whole, h->image, h->bytes + 2 * h->guard);
    if (at == SIZE_MAX)
        return true;
    snprintf(
        why, why_bytes, "host byte %zd relative to the destination is 0x%02x, expected 0x%02x (%s)",
        (ssize_t)at - (ssize_t)h->guard, h->whole[at], h->image[at],
        at < h->guard || at >= h->guard + h->bytes ? "guard byte overwritten" : "wrong payload");
    return false;
}

static void host_guarded_free(host_guarded *h) {
    free(h->whole);
    free(h->image);
    *h = (host_guarded){0};
}

#define GUARD_BYTES 67         /* odd: payloads start unaligned, copies must not care */
#define KERNEL_GUARD_BYTES 256 /* kernels read floats: keep their buffers aligned */
#define AWKWARD_BYTES 1000003  /* prime */
#define AWKWARD_FLOATS 1000003u

/* Launches metrale:vector_add(a, b, out, n) with `block` threads per block and `grid_x`
 * blocks (0: enough for n). */
static mg_status launch_vector_add(mg_backend *b, mg_kernel *k, mg_stream *s, mg_devptr a,
                                   mg_devptr bb, mg_devptr out, uint32_t n, uint32_t grid_x) {
    mg_dim3 grid, block;
    mg_launch_config_1d(n, 256, &grid, &block);
    if (grid_x)
        grid.x = grid_x;
    mg_launch l;
    mg_launch_init(&l, grid, block, 0);
    mg_launch_arg_ptr(&l, a);
    mg_launch_arg_ptr(&l, bb);
    mg_launch_arg_ptr(&l, out);
    mg_launch_arg_u32(&l, n);
    return mg_launch_run(b, k, s, &l);
}

/* Index of the first element where out != a + b (computed in float, as the kernel does), or
 * SIZE_MAX. */
static size_t vector_add_mismatch(const float *a, const float *b, const float *out, size_t n) {
    for (size_t i = 0; i < n; i++) {
        float want = a[i] + b[i];
        if (memcmp(&want, &out[i], sizeof want) != 0)
            return i;
    }
    return SIZE_MAX;
}

/* ------------------------------------------------------------------ backend and device */

static void check_backend_kind(mg_check_ctx *ctx, mg_check_result *result) {
    mg_backend_kind kind = mg_backend_get_kind(ctx->backend), parsed;
    EXPECT(kind == MG_BACKEND_CPU || kind == MG_BACKEND_CUDA || kind == MG_BACKEND_METAL,
           "mg_backend_get_kind returned %d", (int)kind);
    OK(mg_backend_kind_parse(mg_backend_kind_name(kind), &parsed));
    EXPECT(parsed == kind, "parse(name(%d)) = %d", (int)kind, (int)parsed);
    EXPECT_STATUS(mg_backend_kind_parse("tpu", &parsed), MG_ERR_INVALID_ARGUMENT);
    mg_backend_probe probe;
    OK(mg_backend_probe_kind(kind, &probe));
    EXPECT(probe.compiled_in && probe.usable && probe.device_count >= 1,
           "probe of the open kind %s: compiled_in %d usable %d devices %d",
           mg_backend_kind_name(kind), probe.compiled_in, probe.usable, probe.device_count);
    snprintf(result->detail, sizeof result->detail, "%s, %d device(s)", mg_backend_kind_name(kind),
             probe.device_count);
    PASS();
done:;
}

static void check_device_info(mg_check_ctx *ctx, mg_check_result *result) {
    mg_device_info info;
    memset(&info, 0xA5, sizeof info); /* every field must be written */
    OK(mg_device_get_info(ctx->backend, &info));
    EXPECT(memchr(info.name, 0, sizeof info.name) && info.name[0], "empty or unterminated name");
    EXPECT(memchr(info.driver, 0, sizeof info.driver) && info.driver[0],
           "empty or unterminated driver text");
    EXPECT(info.total_bytes > 0 && info.total_bytes != 0xA5A5A5A5A5A5A5A5ull, "total_bytes %llu",
           (unsigned long long)info.total_bytes);
    EXPECT(info.multiprocessors > 0 && info.multiprocessors < 100000, "multiprocessors %d",
           info.multiprocessors);
    if (mg_backend_get_kind(ctx->backend) == MG_BACKEND_CUDA)
        EXPECT(info.cc_major >= 5, "compute capability %d.%d", info.cc_major, info.cc_minor);
    else
        EXPECT(info.cc_major == 0 && info.cc_minor == 0,
               "compute capability %d.%d on a non-CUDA backend", info.cc_major, info.cc_minor);
    /* Apple GPUs give a threadgroup 32 KiB; CUDA (opt-in) and the CPU backend at least 48. */
    uint32_t min_shared =
        mg_backend_get_kind(ctx->backend) == MG_BACKEND_METAL ? 32u * 1024 : 48u * 1024;
    EXPECT(info.max_shared_per_block_optin >= min_shared &&
               info.max_shared_per_block_optin != 0xA5A5A5A5u,
           "max_shared_per_block_optin %u", info.max_shared_per_block_optin);
    snprintf(result->detail, sizeof result->detail, "%s, %.1f GiB, %d MPs, cc %d.%d, %s", info.name,
             (double)info.total_bytes / (1024.0 * 1024 * 1024), info.multiprocessors, info.cc_major,
             info.cc_minor, info.driver);
    PASS();
done:;
}

static void check_memory_queries(mg_check_ctx *ctx, mg_check_result *result) {
    uint64_t free_bytes = 0, total_bytes = 0, device_free = 0;
    OK(mg_memory_free_bytes(ctx->backend, &free_bytes, &total_bytes));
    OK(mg_memory_device_free_bytes(ctx->backend, &device_free));
    EXPECT(total_bytes > 0, "total 0");
    EXPECT(free_bytes > 0 && free_bytes <= total_bytes, "free %llu of total %llu",
           (unsigned long long)free_bytes, (unsigned long long)total_bytes);
    EXPECT(device_free > 0 && device_free <= total_bytes, "device free %llu of total %llu",
           (unsigned long long)device_free, (unsigned long long)total_bytes);
    mg_device_info info;
    OK(mg_device_get_info(ctx->backend, &info));
    if (info.integrated)
        EXPECT(free_bytes >= device_free, "integrated: free %llu below the driver's %llu",
               (unsigned long long)free_bytes, (unsigned long long)device_free);
    snprintf(result->detail, sizeof result->detail, "free %.2f of %.2f GiB",
             (double)free_bytes / (1 << 30), (double)total_bytes / (1 << 30));
    PASS();
done:;
}

static void check_capabilities(mg_check_ctx *ctx, mg_check_result *result) {
    mg_backend *b = ctx->backend;
    char list[256] = "";
    static const char *const names[] = {
        "managed", "graphs",      "graph_update", "pinned_host", "host_device_pointer",
        "modules", "event_timing"};
    for (int cap = 0; cap <= MG_CAP_EVENT_TIMING; cap++)
        if (mg_backend_supports(b, (mg_capability)cap))
            snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", list[0] ? " " : "",
                     names[cap]);
    EXPECT(!mg_backend_supports(b, MG_CAP_GRAPH_UPDATE) || mg_backend_supports(b, MG_CAP_GRAPHS),
           "graph update without graphs");
    EXPECT(!mg_backend_supports(b, MG_CAP_COUNT), "MG_CAP_COUNT reported as supported");
    EXPECT(mg_backend_supports(b, MG_CAP_EVENT_TIMING), "no event timing: every backend has it");
    snprintf(result->detail, sizeof result->detail, "%s", list);
    PASS();
done:;
}

/* ------------------------------------------------------------------ allocation */

static void check_alloc_free(mg_check_ctx *ctx, mg_check_result *result) {
    mg_backend *b = ctx->backend;
    uint64_t r = mg_check_rng_seed(ctx, "alloc_free");
    static const size_t sizes[] = {1, 255, 257, 4099, AWKWARD_BYTES};
    enum { COUNT = sizeof sizes / sizeof sizes[0] };
    mg_devptr p[COUNT] = {0};
    uint8_t *pattern = NULL, *back = NULL;
    uint64_t live0 = 0, count0 = 0, live1, count1;
    OK(mg_ledger_live(b, &live0, &count0));
    for (int i = 0; i < COUNT; i++) {
        OK(mg_alloc(b, sizes[i], &p[i]));
        EXPECT(p[i] != 0 && p[i] % 256 == 0, "allocation %d of %zu bytes at 0x%llx", i, sizes[i],
               (unsigned long long)p[i]);
    }
    /* Each allocation holds its own bytes: write distinct random data to all, read all back. */
    pattern = malloc(AWKWARD_BYTES * (size_t)COUNT);
    back = malloc(AWKWARD_BYTES);
    EXPECT(pattern && back, "out of host memory");
    rng_fill(&r, pattern, AWKWARD_BYTES * (size_t)COUNT);
    for (int i = 0; i < COUNT; i++)
        OK(mg_copy_h2d(b, p[i], pattern + (size_t)i * AWKWARD_BYTES, sizes[i]));
    for (int i = 0; i < COUNT; i++) {
        OK(mg_copy_d2h(b, back, p[i], sizes[i]));
        EXPECT(first_difference(back, pattern + (size_t)i * AWKWARD_BYTES, sizes[i]) == SIZE_MAX,
               "allocation %d (%zu bytes) does not hold its data: allocations overlap", i,
               sizes[i]);
    }
    OK(mg_ledger_live(b, &live1, &count1));
    EXPECT(count1 == count0 + COUNT, "live count %llu after %d allocations from %llu",
           (unsigned long long)count1, COUNT, (unsigned long long)count0);

    OK(mg_free(b, 0));                                             /* null is a no-op */
    EXPECT_STATUS(mg_free(b, p[4] + 16), MG_ERR_INVALID_ARGUMENT); /* interior */
    OK(mg_copy_h2d(b, p[4], pattern, 64)); /* the interior free freed nothing */
    OK(mg_free(b, p[4]));
    EXPECT_STATUS(mg_free(b, p[4]), MG_ERR_INVALID_ARGUMENT); /* double free */
    p[4] = 0;
    for (int i = 0; i < COUNT; i++) {
        OK(mg_free(b, p[i]));
        p[i] = 0;
    }
    OK(mg_ledger_live(b, &live1, &count1));
    EXPECT(count1 == count0 && live1 == live0,
           "ledger %llu bytes / %llu after freeing all, was %llu / %llu", (unsigned long long)live1,
           (unsigned long long)count1, (unsigned long long)live0, (unsigned long long)count0);
    PASS();
done:
    for (int i = 0; i < COUNT; i++)
        mg_free(b, p[i]);
    free(pattern);
    free(back);
}

static void check_alloc_managed(mg_check_ctx *ctx, mg_check_result *result) {
    mg_backend *b = ctx->backend;
    uint64_t r = mg_check_rng_seed(ctx, "alloc_managed");
    mg_devptr p = 0;
    uint8_t data[3001], back[3001];
    if (!mg_backend_supports(b, MG_CAP_MANAGED_MEMORY)) {
        EXPECT_STATUS(mg_alloc_managed(b, 4096, &p), MG_ERR_UNSUPPORTED);
        result->skipped = true;
        snprintf(result->detail, sizeof result->detail,
                 "no managed memory (refused as unsupported)");
        PASS();
        goto done;
    }
    rng_fill(&r, data, sizeof data);
    OK(mg_alloc_managed(b, sizeof data, &p));
    EXPECT(p % 256 == 0, "managed allocation at 0x%llx not 256-aligned", (unsigned long long)p);
    OK(mg_copy_h2d(b, p, data, sizeof data));
    OK(mg_copy_d2h(b, back, p, sizeof back));
    EXPECT(!memcmp(data, back, sizeof data), "managed memory round trip differs");
    OK(mg_free(b, p));
    p = 0;
    PASS();
done:
    mg_free(b, p);
}

/* ------------------------------------------------------------------ ledger */

static void check_ledger_live_and_sites(mg_check_ctx *ctx, mg_check_result *result) {
    mg_backend *b = ctx->backend;
    mg_devptr small[2] = {0}, large = 0;
    uint64_t live0, count0, live1, count1;
    mg_ledger_site sites[64];
    size_t written = 0;
    OK(mg_ledger_live(b, &live0, &count0));
    int line_small = __LINE__ + 2;
    for (int i = 0; i < 2; i++)
        OK(mg_alloc(b, 3001, &small[i]));
    int line_large = __LINE__ + 1;
    OK(mg_alloc(b, 100003, &large));
    OK(mg_ledger_live(b, &live1, &count1));
    EXPECT(count1 - count0 == 3, "live count grew by %llu for 3 allocations",
           (unsigned long long)(count1 - count0));
    EXPECT(live1 - live0 >= 2 * 3001 + 100003 && live1 - live0 < 2 * 3001 + 100003 + 3 * 4096,
           "live bytes grew by %llu for 106005 requested", (unsigned long long)(live1 - live0));

    OK(mg_ledger_top_sites(b, 0, sites, 64, &written));
    int found_small = -1, found_large = -1;
    for (size_t i = 0; i < written; i++) {
        if (i > 0)
            EXPECT(sites[i - 1].bytes >= sites[i].bytes, "sites not sorted largest first");
        if (!sites[i].file || !strstr(sites[i].file, "conformance.c"))
            continue;
        if (sites[i].line == line_small)
            found_small = (int)i;
        if (sites[i].line == line_large)
            found_large = (int)i;
    }
    EXPECT(found_small >= 0 && found_large >= 0,
           "conformance.c:%d or :%d missing from %zu top sites", line_small, line_large, written);
    EXPECT(sites[found_small].count == 2 && sites[found_small].bytes >= 2 * 3001,
           "site :%d holds %llu bytes in %llu allocations, expected 2 of 3001", line_small,
           (unsigned long long)sites[found_small].bytes,
           (unsigned long long)sites[found_small].count);
    EXPECT(sites[found_large].count == 1 && sites[found_large].bytes >= 100003,
           "site :%d holds %llu bytes in %llu allocations", line_large,
           (unsigned long long)sites[found_large].bytes,
           (unsigned long long)sites[found_large].count);
    EXPECT(found_large < found_small, "the larger site is listed after the smaller");

    /* min_bytes filters, max_sites limits. */
    OK(mg_ledger_top_sites(b, 50000, sites, 64, &written));
    for (size_t i = 0; i < written; i++)
        EXPECT(sites[i].bytes >= 50000, "site below min_bytes listed: %llu bytes",
               (unsigned long long)sites[i].bytes);
    OK(mg_ledger_top_sites(b, 0, sites, 1, &written));
    EXPECT(written == 1, "max_sites 1 wrote %zu", written);

    OK(mg_free(b, large));
    large = 0;
    OK(mg_ledger_top_sites(b, 0, sites, 64, &written));
    for (size_t i = 0; i < written; i++)
        EXPECT(!(sites[i].file && strstr(sites[i].file, "conformance.c") &&
                 sites[i].line == line_large),
               "freed site still listed");
    PASS();
done:
    mg_free(b, small[0]);
    mg_free(b, small[1]);
    mg_free(b, large);
}

static void check_ledger_report(mg_check_ctx *ctx, mg_check_result *result) {
    mg_backend *b = ctx->backend;
    mg_devptr p = 0;
    FILE *f = NULL;
    char text[8192];
    int line = __LINE__ + 1;
    OK(mg_alloc(b, 77777, &p));
    f = tmpfile();
    EXPECT(f, "tmpfile failed");
    OK(mg_ledger_report(b, f, 1000, 0));
    rewind(f);
    size_t n = fread(text, 1, sizeof text - 1, f);
    text[n] = '\0';
    char needle[32];
    snprintf(needle, sizeof needle, "%d", line);
    EXPECT(strstr(text, "conformance.c") && strstr(text, needle),
           "report does not name conformance.c:%d: \"%.200s\"", line, text);
    int lines = 0;
    for (size_t i = 0; i < n; i++)
        lines += text[i] == '\n';
    EXPECT(lines >= 2, "report has %d lines, expected a site and the totals", lines);
    PASS();
done:
    if (f)
        fclose(f);
    mg_free(b, p);
}

static void check_ledger_sweep(mg_check_ctx *ctx, mg_check_result *result) {
    mg_backend *b = ctx->backend;
    uint64_t live0, count0, freed_bytes = 0, freed_count = 0;
    mg_devptr p[3] = {0};
    OK(mg_ledger_live(b, &live0, &count0));
    if (count0 != 0) {
        result->skipped = true;
        snprintf(result->detail, sizeof result->detail,
                 "the backend holds %llu live allocations the sweep would free",
                 (unsigned long long)count0);
        PASS();
        goto done;
    }
    OK(mg_alloc(b, 1000, &p[0]));
    OK(mg_alloc(b, 20000, &p[1]));
    OK(mg_alloc_at(b, 300000, MG_ALLOC_ARENA, &p[2], __FILE__, __LINE__));
    OK(mg_ledger_sweep(b, &freed_bytes, &freed_count));
    EXPECT(freed_count == 3 && freed_bytes >= 321000 && freed_bytes < 321000 + 3 * 4096,
           "sweep freed %llu allocations, %llu bytes; expected 3, 321000",
           (unsigned long long)freed_count, (unsigned long long)freed_bytes);
    uint64_t live, count;
    OK(mg_ledger_live(b, &live, &count));
    EXPECT(live == 0 && count == 0, "after the sweep %llu bytes in %llu allocations live",
           (unsigned long long)live, (unsigned long long)count);
    EXPECT_STATUS(mg_free(b, p[1]), MG_ERR_INVALID_ARGUMENT); /* swept means freed */
    p[0] = p[1] = p[2] = 0;
    OK(mg_ledger_sweep(b, &freed_bytes, &freed_count));
    EXPECT(freed_count == 0 && freed_bytes == 0, "second sweep freed %llu",
           (unsigned long long)freed_count);
    PASS();
done:
    for (int i = 0; i < 3; i++)
        mg_free(b, p[i]);
}

/* ------------------------------------------------------------------ copies and memsets */

static void check_copy_blocking(mg_check_ctx *ctx, mg_check_result *result) {
    mg_backend *b = ctx->backend;
    uint64_t r = mg_check_rng_seed(ctx, "copy_blocking");
    const size_t n = AWKWARD_BYTES;
    guarded d1 = {0}, d2 = {0};
    host_guarded h = {0};
    uint8_t *src = malloc(n);
    char why[256];
    EXPECT(src, "out of host memory");
    rng_fill(&r, src, n);
    OK(guarded_alloc(b, &r, n, GUARD_BYTES, &d1));
    OK(guarded_alloc(b, &r, n, GUARD_BYTES, &d2));
    EXPECT(host_guarded_alloc(&r, n, GUARD_BYTES, &h), "out of host memory");

    OK(mg_copy_h2d(b, d1.dst, src, n));
    memcpy(guarded_payload(&d1), src, n);
    EXPECT(guarded_verify(b, &d1, why, sizeof why), "h2d: %s", why);

    OK(mg_copy_d2d(b, d2.dst, d1.dst, n));
    memcpy(guarded_payload(&d2), src, n);
    EXPECT(guarded_verify(b, &d2, why, sizeof why), "d2d: %s", why);

    OK(mg_copy_d2h(b, h.dst, d2.dst, n));
    memcpy(h.image + h.guard, src, n);
    EXPECT(host_guarded_verify(&h, why, sizeof why), "d2h: %s", why);

    /* An interior sub-range of odd offset and length. */
    OK(mg_copy_d2d(b, d2.dst + 1001, d1.dst + 7, 4093));
    memcpy(guarded_payload(&d2) + 1001, src + 7, 4093);
    EXPECT(guarded_verify(b, &d2, why, sizeof why), "interior d2d: %s", why);

    /* Zero bytes: a no-op that still accepts valid handles. */
    OK(mg_copy_h2d(b, d1.dst, src + 1, 0));
    OK(mg_copy_d2h(b, h.dst, d1.dst, 0));
    OK(mg_copy_d2d(b, d2.dst, d1.dst, 0));
    EXPECT(guarded_verify(b, &d1, why, sizeof why), "zero-byte copy wrote: %s", why);
    PASS();
done:
    guarded_free(b, &d1);
    guarded_free(b, &d2);
    host_guarded_free(&h);
    free(src);
}

static void check_copy_async(mg_check_ctx *ctx, mg_check_result *result) {
    mg_backend *b = ctx->backend;
    uint64_t r = mg_check_rng_seed(ctx, "copy_async");
    const size_t n = AWKWARD_BYTES;
    guarded d1 = {0}, d2 = {0}, d3 = {0};
    host_guarded h = {0};
    mg_stream *s = NULL;
    uint8_t *src = malloc(n), *pageable = malloc(n), *pinned = NULL;
    char why[256];
    EXPECT(src && pageable, "out of host memory");
    rng_fill(&r, src, n);
    OK(mg_stream_create(b, &s));
    OK(guarded_alloc(b, &r, n, GUARD_BYTES, &d1));
    OK(guarded_alloc(b, &r, n, GUARD_BYTES, &d2));
    OK(guarded_alloc(b, &r, n, GUARD_BYTES, &d3));
    EXPECT(host_guarded_alloc(&r, n, GUARD_BYTES, &h), "out of host memory");

    /* Pageable source overwritten as soon as the call returns: the copy must not see it. */
    memcpy(pageable, src, n);
    OK(mg_copy_h2d_async(b, d1.dst, pageable, n, s));
    memset(pageable, 0xEE, n);
    /* Pinned source (mg_host_alloc), also reused on return. */
    OK(mg_host_alloc(b, n, (void **)&pinned));
    memcpy(pinned, src, n);
    OK(mg_copy_h2d_async(b, d2.dst, pinned, n, s));
    memset(pinned, 0xDD, n);
    OK(mg_stream_synchronize(s));
    memcpy(guarded_payload(&d1), src, n);
    memcpy(guarded_payload(&d2), src, n);
    EXPECT(guarded_verify(b, &d1, why, sizeof why), "h2d_async from pageable memory: %s", why);
    EXPECT(guarded_verify(b, &d2, why, sizeof why), "h2d_async from pinned memory: %s", why);

    /* Retained: the source stays valid until the stream syncs. */
    rng_fill(&r, pageable, n);
    OK(mg_copy_h2d_async_retained(b, d3.dst, pageable, n, s));
    OK(mg_stream_synchronize(s));
    memcpy(guarded_payload(&d3), pageable, n);
    EXPECT(guarded_verify(b, &d3, why, sizeof why), "h2d_async_retained: %s", why);

    /* d2d then d2h on the same stream, in order. */
    OK(mg_copy_d2d_async(b, d1.dst + 3, d3.dst + 11, n - 20, s));
    memcpy(guarded_payload(&d1) + 3, pageable + 11, n - 20);
    OK(mg_copy_d2h_async(b, h.dst, d1.dst, n, s));
    OK(mg_stream_synchronize(s));
    EXPECT(guarded_verify(b, &d1, why, sizeof why), "d2d_async: %s", why);
    memcpy(h.image + h.guard, guarded_payload(&d1), n);
    EXPECT(host_guarded_verify(&h, why, sizeof why), "d2h_async: %s", why);

    /* The default stream (NULL) works too. */
    OK(mg_copy_d2d_async(b, d2.dst, d1.dst, 4099, NULL));
    OK(mg_stream_synchronize(mg_stream_default(b)));
    memcpy(guarded_payload(&d2), guarded_payload(&d1), 4099);
    EXPECT(guarded_verify(b, &d2, why, sizeof why), "d2d_async on the default stream: %s", why);
    PASS();
done:
    mg_stream_destroy(s); /* waits for the stream's work */
    mg_host_free(b, pinned);
    guarded_free(b, &d1);
    guarded_free(b, &d2);
    guarded_free(b, &d3);
    host_guarded_free(&h);
    free(src);
    free(pageable);
}

static void check_copy_2d(mg_check_ctx *ctx, mg_check_result *result) {
    mg_backend *b = ctx->backend;
    uint64_t r = mg_check_rng_seed(ctx, "copy_2d");
    const size_t width = 37, height = 19, src_pitch = 64, dst_pitch = 45;
    guarded src = {0}, dst = {0};
    char why[256];
    OK(guarded_alloc(b, &r, src_pitch * height, GUARD_BYTES, &src));
    OK(guarded_alloc(b, &r, dst_pitch * height, GUARD_BYTES, &dst));
    OK(mg_copy_2d_d2d_async(b, dst.dst, dst_pitch, src.dst, src_pitch, width, height, NULL));
    OK(mg_stream_synchronize(mg_stream_default(b)));
    /* Only width bytes per row move; the pitch padding between rows keeps its poison. */
    for (size_t row = 0; row < height; row++)
        memcpy(guarded_payload(&dst) + row * dst_pitch, guarded_payload(&src) + row * src_pitch,
               width);
    EXPECT(guarded_verify(b, &dst, why, sizeof why), "2-D copy: %s", why);
    EXPECT(guarded_verify(b, &src, why, sizeof why), "2-D copy changed its source: %s", why);
    /* Degenerate shapes move nothing. */
    OK(mg_copy_2d_d2d_async(b, dst.dst, dst_pitch, src.dst, src_pitch, 0, height, NULL));
    OK(mg_copy_2d_d2d_async(b, dst.dst, dst_pitch, src.dst, src_pitch, width, 0, NULL));
    OK(mg_stream_synchronize(mg_stream_default(b)));
    EXPECT(guarded_verify(b, &dst, why, sizeof why), "empty 2-D copy wrote: %s", why);
    PASS();
done:
    guarded_free(b, &src);
    guarded_free(b, &dst);
}

static void check_memset(mg_check_ctx *ctx, mg_check_result *result) {
    mg_backend *b = ctx->backend;
    uint64_t r = mg_check_rng_seed(ctx, "memset");
    guarded d = {0};
    mg_stream *s = NULL;
    char why[256];
    OK(guarded_alloc(b, &r, AWKWARD_BYTES, GUARD_BYTES, &d));
    uint8_t value = (uint8_t)(mg_check_rng_next(&r) >> 56);
    OK(mg_memset(b, d.dst + 5, value, AWKWARD_BYTES - 12));
    memset(guarded_payload(&d) + 5, value, AWKWARD_BYTES - 12);
    EXPECT(guarded_verify(b, &d, why, sizeof why), "memset 0x%02x: %s", value, why);

    OK(mg_stream_create(b, &s));
    uint8_t value2 = (uint8_t)(value ^ 0x5A);
    OK(mg_memset_async(b, d.dst, value2, 1021, s));
    OK(mg_memset_async(b, d.dst + 1021, (uint8_t)(value2 + 1), AWKWARD_BYTES - 1021, s));
    OK(mg_stream_synchronize(s));
    memset(guarded_payload(&d), value2, 1021);
    memset(guarded_payload(&d) + 1021, (uint8_t)(value2 + 1), AWKWARD_BYTES - 1021);
    EXPECT(guarded_verify(b, &d, why, sizeof why), "memset_async: %s", why);
    OK(mg_memset(b, d.dst, 0, 0));
    OK(mg_memset_async(b, d.dst, 0, 0, s));
    OK(mg_stream_synchronize(s));
    EXPECT(guarded_verify(b, &d, why, sizeof why), "zero-byte memset wrote: %s", why);
    PASS();
done:
    mg_stream_destroy(s);
    guarded_free(b, &d);
}

/* ------------------------------------------------------------------ streams and events */

static void check_stream_default(mg_check_ctx *ctx, mg_check_result *result) {
    mg_backend *b = ctx->backend;
    mg_stream *d = mg_stream_default(b);
    bool capturing = true;
    EXPECT(d != NULL, "no default stream: %s", mg_last_error());
    EXPECT(mg_stream_default(b) == d, "the default stream changed between calls");
    OK(mg_stream_is_capturing(d, &capturing));
    EXPECT(!capturing, "the default stream reports capturing");
    OK(mg_stream_synchronize(d));
    EXPECT_STATUS(mg_stream_destroy(d), MG_ERR_INVALID_ARGUMENT);
    OK(mg_stream_synchronize(d)); /* still usable */
    OK(mg_stream_destroy(NULL));
    PASS();
done:;
}

/* Work on one stream runs in order: upload, copy, overwrite part, download. */
static void check_stream_order(mg_check_ctx *ctx, mg_check_result *result) {
    mg_backend *b = ctx->backend;
    uint64_t r = mg_check_rng_seed(ctx, "stream_order");
    enum { STREAMS = 3 };
    const size_t n = 65537;
    mg_stream *s[STREAMS] = {0};
    guarded a[STREAMS] = {{0}}, c[STREAMS] = {{0}};
    uint8_t *src[STREAMS] = {0}, *pinned_out = NULL;
    char why[256];
    OK(mg_host_alloc(b, n * STREAMS, (void **)&pinned_out));
    for (int i = 0; i < STREAMS; i++) {
        OK(mg_stream_create(b, &s[i]));
        OK(guarded_alloc(b, &r, n, GUARD_BYTES, &a[i]));
        OK(guarded_alloc(b, &r, n, GUARD_BYTES, &c[i]));
        src[i] = malloc(n);
        EXPECT(src[i], "out of host memory");
        rng_fill(&r, src[i], n);
    }
    for (int i = 0; i < STREAMS; i++) {
        OK(mg_copy_h2d_async(b, a[i].dst, src[i], n, s[i]));
        OK(mg_copy_d2d_async(b, c[i].dst, a[i].dst, n, s[i]));
        OK(mg_memset_async(b, c[i].dst + 100, (uint8_t)(0x10 + i), 333, s[i]));
        OK(mg_copy_d2h_async(b, pinned_out + (size_t)i * n, c[i].dst, n, s[i]));
    }
    for (int i = 0; i < STREAMS; i++) {
        OK(mg_stream_synchronize(s[i]));
        memcpy(guarded_payload(&c[i]), src[i], n);
        memset(guarded_payload(&c[i]) + 100, 0x10 + i, 333);
        EXPECT(guarded_verify(b, &c[i], why, sizeof why), "stream %d: %s", i, why);
        size_t at = first_difference(pinned_out + (size_t)i * n, guarded_payload(&c[i]), n);
        EXPECT(at == SIZE_MAX, "stream %d: downloaded byte %zu differs (work ran out of order)", i,
               at);
    }
    PASS();
done:
    for (int i = 0; i < STREAMS; i++) {
        mg_stream_destroy(s[i]);
        guarded_free(b, &a[i]);
        guarded_free(b, &c[i]);
        free(src[i]);
    }
    mg_host_free(b, pinned_out);
}

static void check_events(mg_check_ctx *ctx, mg_check_result *result) {
    mg_backend *b = ctx->backend;
    uint64_t r = mg_check_rng_seed(ctx, "events");
    mg_event *start = NULL, *end = NULL, *never = NULL;
    mg_stream *s = NULL;
    guarded d = {0};
    float ms = -1.0f, never_ms = 0;
    OK(mg_stream_create(b, &s));
    OK(mg_event_create(b, &start));
    OK(mg_event_create(b, &end));
    OK(mg_event_create(b, &never));
    /* A never-recorded event: query succeeds and synchronize returns, as on CUDA; it has no
     * time, so elapsed with it fails. */
    OK(mg_event_query(never));
    OK(mg_event_synchronize(never));
    EXPECT(mg_event_elapsed_ms(never, never, &never_ms) != MG_OK,
           "elapsed time of a never-recorded event succeeded");

    OK(guarded_alloc(b, &r, 4u << 20, GUARD_BYTES, &d));
    OK(mg_event_record(start, s));
    OK(mg_memset_async(b, d.dst, 0x3C, 4u << 20, s));
    OK(mg_event_record(end, s));
    OK(mg_event_synchronize(end));
    OK(mg_event_query(end)); /* completed once synchronized */
    OK(mg_event_query(start));
    OK(mg_event_elapsed_ms(start, end, &ms));
    EXPECT(ms >= 0.0f && isfinite(ms) && ms < 60000.0f, "elapsed %g ms", (double)ms);
    EXPECT(mg_event_elapsed_ms(start, never, &never_ms) != MG_OK,
           "elapsed time to a never-recorded event succeeded");
    /* Re-recording moves the event. */
    OK(mg_event_record(start, s));
    OK(mg_event_synchronize(start));
    OK(mg_event_query(start));
    /* Events on the default stream. */
    OK(mg_event_record(end, NULL));
    OK(mg_event_synchronize(end));
    OK(mg_event_destroy(never));
    never = NULL;
    snprintf(result->detail, sizeof result->detail, "memset 4 MiB: %.3f ms", (double)ms);
    PASS();
done:
    mg_event_destroy(start);
    mg_event_destroy(end);
    mg_event_destroy(never);
    mg_stream_destroy(s);
    guarded_free(b, &d);
}

/* Stream 2 waits on an event recorded after stream 1's upload, then reads what it wrote. */
static void check_stream_wait_event(mg_check_ctx *ctx, mg_check_result *result) {
    mg_backend *b = ctx->backend;
    uint64_t r = mg_check_rng_seed(ctx, "stream_wait_event");
    const size_t n = 1u << 22;
    mg_stream *s1 = NULL, *s2 = NULL;
    mg_event *e = NULL;
    guarded a = {0}, c = {0};
    uint8_t *src = NULL;
    char why[256];
    OK(mg_stream_create(b, &s1));
    OK(mg_stream_create(b, &s2));
    OK(mg_event_create(b, &e));
    OK(guarded_alloc(b, &r, n, GUARD_BYTES, &a));
    OK(guarded_alloc(b, &r, n, GUARD_BYTES, &c));
    OK(mg_host_alloc(b, n, (void **)&src));
    rng_fill(&r, src, n);
    OK(mg_copy_h2d_async_retained(b, a.dst, src, n, s1));
    OK(mg_memset_async(b, a.dst + n / 2, 0x77, 4099, s1));
    OK(mg_event_record(e, s1));
    OK(mg_stream_wait_event(s2, e));
    OK(mg_copy_d2d_async(b, c.dst, a.dst, n, s2));
    OK(mg_stream_synchronize(s2));
    memcpy(guarded_payload(&c), src, n);
    memset(guarded_payload(&c) + n / 2, 0x77, 4099);
    EXPECT(guarded_verify(b, &c, why, sizeof why), "stream 2 did not see stream 1's work: %s", why);
    OK(mg_stream_synchronize(s1));
    OK(mg_event_query(e));
    PASS();
done:
    mg_event_destroy(e);
    mg_stream_destroy(s1);
    mg_stream_destroy(s2);
    mg_host_free(b, src);
    guarded_free(b, &a);
    guarded_free(b, &c);
}

/* ------------------------------------------------------------------ graphs */

/* Buffers of the graph checks: input a arrives from pinned host memory, input b from a
 * device staging buffer, the sum is downloaded into pinned host memory. */
typedef struct graph_io {
    uint32_t n;
    float *host_a, *host_out; /* mg_host_alloc */
    float *want_b;
    mg_devptr a, b, staging_b, out; /* guard-free kernel buffers, 256-aligned */
} graph_io;

static mg_status graph_io_alloc(mg_backend *b, uint32_t n, graph_io *io) {
    *io = (graph_io){.n = n};
    size_t bytes = (size_t)n * sizeof(float);
    mg_status st;
    if ((st = mg_host_alloc(b, bytes, (void **)&io->host_a)) ||
        (st = mg_host_alloc(b, bytes, (void **)&io->host_out)) ||
        (st = mg_alloc(b, bytes, &io->a)) || (st = mg_alloc(b, bytes, &io->b)) ||
        (st = mg_alloc(b, bytes, &io->staging_b)) || (st = mg_alloc(b, bytes, &io->out)))
        return st;
    io->want_b = malloc(bytes);
    return io->want_b ? MG_OK : MG_ERR_OUT_OF_MEMORY;
}

static void graph_io_free(mg_backend *b, graph_io *io) {
    mg_host_free(b, io->host_a);
    mg_host_free(b, io->host_out);
    mg_free(b, io->a);
    mg_free(b, io->b);
    mg_free(b, io->staging_b);
    mg_free(b, io->out);
    free(io->want_b);
    *io = (graph_io){0};
}

/* New random inputs: a in pinned host memory, b uploaded into the staging buffer; the
 * output poisoned on the device and on the host. */
static mg_status graph_io_new_inputs(mg_backend *b, uint64_t *r, graph_io *io) {
    size_t bytes = (size_t)io->n * sizeof(float);
    rng_floats(r, io->host_a, io->n);
    rng_floats(r, io->want_b, io->n);
    rng_fill(r, io->host_out, bytes);
    mg_status st = mg_copy_h2d(b, io->staging_b, io->want_b, bytes);
    if (!st)
        st = mg_memset(b, io->out, 0xFF, bytes); /* NaN pattern */
    return st;
}

/* The step a graph replays: upload a, copy b in, clear out, add, download. */
static mg_status graph_io_record_step(mg_backend *b, mg_kernel *k, mg_stream *s, graph_io *io,
                                      uint32_t n) {
    size_t bytes = (size_t)n * sizeof(float);
    mg_status st;
    if ((st = mg_copy_h2d_async_retained(b, io->a, io->host_a, bytes, s)) ||
        (st = mg_copy_d2d_async(b, io->b, io->staging_b, bytes, s)) ||
        (st = mg_memset_async(b, io->out, 0, bytes, s)) ||
        (st = launch_vector_add(b, k, s, io->a, io->b, io->out, n, 0)) ||
        (st = mg_copy_d2h_async(b, io->host_out, io->out, bytes, s)))
        return st;
    return MG_OK;
}

static void check_graph_capture_replay(mg_check_ctx *ctx, mg_check_result *result) {
    mg_backend *b = ctx->backend;
    uint64_t r = mg_check_rng_seed(ctx, "graph_capture_replay");
    mg_stream *s = NULL;
    mg_graph *g = NULL;
    mg_kernel *k = NULL;
    graph_io io = {0};
    float *poison = NULL;
    bool capturing = false;
    const uint32_t n = 100003;
    if (!mg_backend_supports(b, MG_CAP_GRAPHS)) {
        result->skipped = true;
        snprintf(result->detail, sizeof result->detail, "backend has no graphs");
        PASS();
        goto done;
    }
    OK(graph_io_alloc(b, n, &io));
    OK(mg_kernel_lookup(b, "metrale", "vector_add", &k));
    OK(mg_stream_create(b, &s));
    OK(graph_io_new_inputs(b, &r, &io));
    poison = malloc((size_t)n * sizeof(float));
    EXPECT(poison, "out of host memory");
    memcpy(poison, io.host_out, (size_t)n * sizeof(float));

    OK(mg_graph_begin_capture(s));
    OK(mg_stream_is_capturing(s, &capturing));
    EXPECT(capturing, "stream not capturing after begin_capture");
    OK(graph_io_record_step(b, k, s, &io, n));
    OK(mg_graph_end_capture(s, &g));
    OK(mg_stream_is_capturing(s, &capturing));
    EXPECT(!capturing, "stream still capturing after end_capture");
    EXPECT(!memcmp(io.host_out, poison, (size_t)n * sizeof(float)),
           "captured work ran during the capture");

    for (int replay = 0; replay < 3; replay++) {
        if (replay > 0)
            OK(graph_io_new_inputs(b, &r, &io));
        OK(mg_graph_launch(g, s));
        OK(mg_stream_synchronize(s));
        size_t at = vector_add_mismatch(io.host_a, io.want_b, io.host_out, n);
        EXPECT(at == SIZE_MAX, "replay %d: out[%zu] = %g, expected %g + %g", replay, at,
               (double)io.host_out[at], (double)io.host_a[at], (double)io.want_b[at]);
    }
    /* A graph may be launched on another stream too (the default one). */
    OK(graph_io_new_inputs(b, &r, &io));
    OK(mg_graph_launch(g, NULL));
    OK(mg_stream_synchronize(mg_stream_default(b)));
    EXPECT(vector_add_mismatch(io.host_a, io.want_b, io.host_out, n) == SIZE_MAX,
           "replay on the default stream differs");
    PASS();
done:
    mg_graph_destroy(g);
    mg_stream_destroy(s);
    mg_kernel_release(k);
    graph_io_free(b, &io);
    free(poison);
}

static void check_graph_update(mg_check_ctx *ctx, mg_check_result *result) {
    mg_backend *b = ctx->backend;
    uint64_t r = mg_check_rng_seed(ctx, "graph_update");
    mg_stream *s = NULL;
    mg_graph *g = NULL;
    mg_kernel *k = NULL;
    graph_io io = {0};
    bool in_place = false;
    const uint32_t n = 50021, n2 = 40009;
    if (!mg_backend_supports(b, MG_CAP_GRAPHS) || !mg_backend_supports(b, MG_CAP_GRAPH_UPDATE)) {
        result->skipped = true;
        snprintf(result->detail, sizeof result->detail, "backend has no graph update");
        PASS();
        goto done;
    }
    OK(graph_io_alloc(b, n, &io));
    OK(mg_kernel_lookup(b, "metrale", "vector_add", &k));
    OK(mg_stream_create(b, &s));
    OK(mg_graph_begin_capture(s));
    OK(graph_io_record_step(b, k, s, &io, n));
    OK(mg_graph_end_capture(s, &g));

    /* Same nodes, other sizes: updated in place. */
    OK(mg_graph_begin_capture(s));
    OK(graph_io_record_step(b, k, s, &io, n2));
    OK(mg_graph_end_capture_update(s, g, &in_place));
    EXPECT(in_place, "parameter-only change was not updated in place");
    OK(graph_io_new_inputs(b, &r, &io));
    uint8_t tail_poison[64];
    memcpy(tail_poison, &io.host_out[n2], sizeof tail_poison);
    OK(mg_graph_launch(g, s));
    OK(mg_stream_synchronize(s));
    size_t at = vector_add_mismatch(io.host_a, io.want_b, io.host_out, n2);
    EXPECT(at == SIZE_MAX, "updated graph: out[%zu] wrong", at);
    /* Elements past n2 are not part of the updated graph: their host poison stays. */
    EXPECT(!memcmp(tail_poison, &io.host_out[n2], sizeof tail_poison),
           "updated graph still wrote past its new size %u", n2);

    /* Another node: re-instantiated, still valid. */
    OK(mg_graph_begin_capture(s));
    OK(graph_io_record_step(b, k, s, &io, n));
    OK(mg_memset_async(b, io.b, 0, sizeof(float), s));
    OK(mg_graph_end_capture_update(s, g, &in_place));
    EXPECT(!in_place, "a graph with an extra node reported an in-place update");
    OK(graph_io_new_inputs(b, &r, &io));
    OK(mg_graph_launch(g, s));
    OK(mg_stream_synchronize(s));
    at = vector_add_mismatch(io.host_a, io.want_b, io.host_out, n);
    EXPECT(at == SIZE_MAX, "re-instantiated graph: out[%zu] wrong", at);
    PASS();
done:
    mg_graph_destroy(g);
    mg_stream_destroy(s);
    mg_kernel_release(k);
    graph_io_free(b, &io);
}

static void check_graph_abort(mg_check_ctx *ctx, mg_check_result *result) {
    mg_backend *b = ctx->backend;
    uint64_t r = mg_check_rng_seed(ctx, "graph_abort");
    mg_stream *s = NULL;
    guarded d = {0};
    bool capturing = true;
    char why[256];
    if (!mg_backend_supports(b, MG_CAP_GRAPHS)) {
        result->skipped = true;
        snprintf(result->detail, sizeof result->detail, "backend has no graphs");
        PASS();
        goto done;
    }
    OK(guarded_alloc(b, &r, 8191, GUARD_BYTES, &d));
    OK(mg_stream_create(b, &s));
    OK(mg_graph_begin_capture(s));
    OK(mg_memset_async(b, d.dst, 0x42, 8191, s));
    OK(mg_graph_abort_capture(s));
    OK(mg_stream_is_capturing(s, &capturing));
    EXPECT(!capturing, "still capturing after abort");
    OK(mg_stream_synchronize(s));
    EXPECT(guarded_verify(b, &d, why, sizeof why), "aborted capture ran: %s", why);
    /* The stream works normally again. */
    OK(mg_memset_async(b, d.dst, 0x43, 8191, s));
    OK(mg_stream_synchronize(s));
    memset(guarded_payload(&d), 0x43, 8191);
    EXPECT(guarded_verify(b, &d, why, sizeof why), "after abort: %s", why);
    EXPECT(mg_graph_abort_capture(s) != MG_OK, "abort without a capture succeeded");
    PASS();
done:
    mg_stream_destroy(s);
    guarded_free(b, &d);
}

/* What a capturing stream refuses, and that refusing does not end the capture. */
static void check_capture_rules(mg_check_ctx *ctx, mg_check_result *result) {
    mg_backend *b = ctx->backend;
    mg_stream *s = NULL;
    mg_devptr p = 0;
    mg_graph *g = NULL;
    bool capturing = false, began = false;
    if (!mg_backend_supports(b, MG_CAP_GRAPHS)) {
        result->skipped = true;
        snprintf(result->detail, sizeof result->detail, "backend has no graphs");
        PASS();
        goto done;
    }
    OK(mg_stream_create(b, &s));
    OK(mg_graph_begin_capture(s));
    began = true;
    EXPECT_STATUS(mg_stream_synchronize(s), MG_ERR_CAPTURING);
    EXPECT_STATUS(mg_alloc(b, 4096, &p), MG_ERR_CAPTURING);
    EXPECT(p == 0, "refused allocation returned a pointer");
    EXPECT_STATUS(mg_stream_destroy(s), MG_ERR_CAPTURING);
    EXPECT(mg_graph_begin_capture(s) != MG_OK, "a second begin_capture succeeded");
    OK(mg_stream_is_capturing(s, &capturing));
    EXPECT(capturing, "a refused call ended the capture");
    OK(mg_graph_end_capture(s, &g));
    began = false;
    OK(mg_graph_launch(g, s)); /* an empty graph */
    OK(mg_stream_synchronize(s));
    PASS();
done:
    if (began)
        mg_graph_abort_capture(s);
    mg_free(b, p);
    mg_graph_destroy(g);
    mg_stream_destroy(s);
}

/* ------------------------------------------------------------------ pinned host memory */

static void check_host_alloc(mg_check_ctx *ctx, mg_check_result *result) {
    mg_backend *b = ctx->backend;
    uint64_t r = mg_check_rng_seed(ctx, "host_alloc");
    static const size_t sizes[] = {1, 63, 65, AWKWARD_BYTES};
    uint8_t *h[4] = {0};
    guarded d = {0};
    char why[256];
    for (int i = 0; i < 4; i++) {
        OK(mg_host_alloc(b, sizes[i], (void **)&h[i]));
        EXPECT(h[i] && (uintptr_t)h[i] % 64 == 0, "host allocation %p not 64-aligned",
               (void *)h[i]);
        for (size_t j = 0; j < sizes[i]; j++)
            EXPECT(h[i][j] == 0, "host allocation of %zu bytes: byte %zu is 0x%02x, not zero",
                   sizes[i], j, h[i][j]);
    }
    /* Usable as a copy source and destination. */
    rng_fill(&r, h[3], AWKWARD_BYTES);
    OK(guarded_alloc(b, &r, AWKWARD_BYTES, GUARD_BYTES, &d));
    OK(mg_copy_h2d(b, d.dst, h[3], AWKWARD_BYTES));
    memcpy(guarded_payload(&d), h[3], AWKWARD_BYTES);
    EXPECT(guarded_verify(b, &d, why, sizeof why), "h2d from host_alloc memory: %s", why);
    OK(mg_host_free(b, NULL));
    uint8_t stack_byte = 0;
    EXPECT_STATUS(mg_host_free(b, &stack_byte), MG_ERR_INVALID_ARGUMENT);
    for (int i = 0; i < 4; i++) {
        OK(mg_host_free(b, h[i]));
        h[i] = NULL;
    }
    PASS();
done:
    for (int i = 0; i < 4; i++)
        mg_host_free(b, h[i]);
    guarded_free(b, &d);
}

/* A kernel reads host_alloc memory through its device address. */
static void check_host_device_pointer(mg_check_ctx *ctx, mg_check_result *result) {
    mg_backend *b = ctx->backend;
    uint64_t r = mg_check_rng_seed(ctx, "host_device_pointer");
    const uint32_t n = 4099;
    float *ha = NULL, *hb = NULL, *out = NULL;
    mg_devptr da = 0, db = 0, dout = 0;
    mg_kernel *k = NULL;
    if (!mg_backend_supports(b, MG_CAP_HOST_DEVICE_POINTER)) {
        result->skipped = true;
        snprintf(result->detail, sizeof result->detail, "backend has no host device pointers");
        PASS();
        goto done;
    }
    OK(mg_host_alloc(b, n * sizeof(float), (void **)&ha));
    OK(mg_host_alloc(b, n * sizeof(float), (void **)&hb));
    out = malloc(n * sizeof(float));
    EXPECT(out, "out of host memory");
    rng_floats(&r, ha, n);
    rng_floats(&r, hb, n);
    OK(mg_host_device_pointer(b, ha, &da));
    OK(mg_host_device_pointer(b, hb, &db));
    EXPECT(da && db, "null device address");
    OK(mg_alloc(b, n * sizeof(float), &dout));
    OK(mg_memset(b, dout, 0xFF, n * sizeof(float)));
    OK(mg_kernel_lookup(b, "metrale", "vector_add", &k));
    OK(launch_vector_add(b, k, NULL, da, db, dout, n, 0));
    OK(mg_stream_synchronize(mg_stream_default(b)));
    OK(mg_copy_d2h(b, out, dout, n * sizeof(float)));
    size_t at = vector_add_mismatch(ha, hb, out, n);
    EXPECT(at == SIZE_MAX, "out[%zu] = %g, expected %g", at, (double)out[at],
           (double)(ha[at] + hb[at]));
    PASS();
done:
    mg_kernel_release(k);
    mg_free(b, dout);
    mg_host_free(b, ha);
    mg_host_free(b, hb);
    free(out);
}

/* ------------------------------------------------------------------ kernels */

static void check_kernel_lookup(mg_check_ctx *ctx, mg_check_result *result) {
    mg_backend *b = ctx->backend;
    mg_kernel *k1 = NULL, *k2 = NULL, *k3 = NULL, *missing = NULL;
    OK(mg_kernel_lookup(b, "metrale", "vector_add", &k1));
    OK(mg_kernel_lookup(b, "metrale", "vector_add", &k2));
    EXPECT(k1 && k1 == k2, "lookups of the same name returned %p and %p", (void *)k1, (void *)k2);
    EXPECT(!strcmp(mg_kernel_name(k1), "metrale:vector_add"), "kernel name \"%s\"",
           mg_kernel_name(k1));
    OK(mg_kernel_lookup(b, "metrale", "empty_kernel", &k3));
    EXPECT(k3 != k1, "different kernels share a handle");
    EXPECT_STATUS(mg_kernel_lookup(b, "metrale", "no_such_kernel_x", &missing), MG_ERR_NOT_FOUND);
    EXPECT(strstr(mg_last_error(), "no_such_kernel_x") && strstr(mg_last_error(), "metrale"),
           "not-found message does not name the module and function: %s", mg_last_error());
    EXPECT_STATUS(mg_kernel_lookup(b, "no_such_module_y", "vector_add", &missing),
                  MG_ERR_NOT_FOUND);
    EXPECT(strstr(mg_last_error(), "no_such_module_y"), "message does not name the module: %s",
           mg_last_error());
    PASS();
done:
    mg_kernel_release(k1);
    mg_kernel_release(k2);
    mg_kernel_release(k3);
}

static void check_kernel_vector_add(mg_check_ctx *ctx, mg_check_result *result) {
    mg_backend *b = ctx->backend;
    uint64_t r = mg_check_rng_seed(ctx, "kernel_vector_add");
    const uint32_t n = AWKWARD_FLOATS;
    const size_t bytes = (size_t)n * sizeof(float);
    float *ha = malloc(bytes), *hb = malloc(bytes), *hout = malloc(bytes);
    mg_devptr da = 0, db = 0;
    guarded out = {0};
    mg_kernel *k = NULL, *empty = NULL;
    mg_stream *s = NULL;
    char why[256];
    EXPECT(ha && hb && hout, "out of host memory");
    rng_floats(&r, ha, n);
    rng_floats(&r, hb, n);
    OK(mg_alloc(b, bytes, &da));
    OK(mg_alloc(b, bytes, &db));
    OK(guarded_alloc(b, &r, bytes, KERNEL_GUARD_BYTES, &out));
    OK(mg_copy_h2d(b, da, ha, bytes));
    OK(mg_copy_h2d(b, db, hb, bytes));
    OK(mg_kernel_lookup(b, "metrale", "vector_add", &k));
    OK(mg_stream_create(b, &s));

    /* A full grid, then a small grid that must still cover n (grid-stride). */
    for (int pass = 0; pass < 2; pass++) {
        uint32_t grid_x = pass == 0 ? 0 : 7;
        OK(mg_memset(b, out.dst, 0xFF, bytes));
        OK(launch_vector_add(b, k, s, da, db, out.dst, n, grid_x));
        OK(mg_stream_synchronize(s));
        OK(mg_copy_d2h(b, hout, out.dst, bytes));
        size_t at = vector_add_mismatch(ha, hb, hout, n);
        EXPECT(at == SIZE_MAX, "grid %u: out[%zu] = %g, expected %g", grid_x, at, (double)hout[at],
               (double)(ha[at] + hb[at]));
    }
    memcpy(guarded_payload(&out), hout, bytes);
    EXPECT(guarded_verify(b, &out, why, sizeof why), "vector_add wrote outside out: %s", why);

    /* n = 0 touches nothing. */
    OK(launch_vector_add(b, k, s, da, db, out.dst, 0, 0));
    OK(mg_stream_synchronize(s));
    EXPECT(guarded_verify(b, &out, why, sizeof why), "n = 0 wrote: %s", why);

    OK(mg_kernel_lookup(b, "metrale", "empty_kernel", &empty));
    mg_launch l;
    mg_launch_init(&l, (mg_dim3){1, 1, 1}, (mg_dim3){1, 1, 1}, 0);
    OK(mg_launch_run(b, empty, s, &l));
    OK(mg_stream_synchronize(s));
    PASS();
done:
    mg_stream_destroy(s);
    mg_kernel_release(k);
    mg_kernel_release(empty);
    mg_free(b, da);
    mg_free(b, db);
    guarded_free(b, &out);
    free(ha);
    free(hb);
    free(hout);
}

static void check_launch_config_1d(mg_check_ctx *ctx, mg_check_result *result) {
    (void)ctx;
    mg_dim3 grid, block;
    mg_launch_config_1d(AWKWARD_FLOATS, 0, &grid, &block);
    EXPECT(block.x == 256 && block.y == 1 && block.z == 1, "block (%u,%u,%u)", block.x, block.y,
           block.z);
    EXPECT(grid.x == (AWKWARD_FLOATS + 255) / 256 && grid.y == 1 && grid.z == 1,
           "grid %u for %u elements", grid.x, AWKWARD_FLOATS);
    mg_launch_config_1d(0, 128, &grid, &block);
    EXPECT(grid.x == 1 && block.x == 128, "n = 0: grid %u block %u", grid.x, block.x);
    PASS();
done:;
}

const mg_check_case mg_checks_conformance[] = {
    {"conformance", "backend_kind", check_backend_kind},
    {"conformance", "device_info", check_device_info},
    {"conformance", "memory_queries", check_memory_queries},
    {"conformance", "capabilities", check_capabilities},
    {"conformance", "alloc_free", check_alloc_free},
    {"conformance", "alloc_managed", check_alloc_managed},
    {"conformance", "ledger_live_and_sites", check_ledger_live_and_sites},
    {"conformance", "ledger_report", check_ledger_report},
    {"conformance", "ledger_sweep", check_ledger_sweep},
    {"conformance", "copy_blocking", check_copy_blocking},
    {"conformance", "copy_async", check_copy_async},
    {"conformance", "copy_2d", check_copy_2d},
    {"conformance", "memset", check_memset},
    {"conformance", "stream_default", check_stream_default},
    {"conformance", "stream_order", check_stream_order},
    {"conformance", "events", check_events},
    {"conformance", "stream_wait_event", check_stream_wait_event},
    {"conformance", "graph_capture_replay", check_graph_capture_replay},
    {"conformance", "graph_update", check_graph_update},
    {"conformance", "graph_abort", check_graph_abort},
    {"conformance", "capture_rules", check_capture_rules},
    {"conformance", "host_alloc", check_host_alloc},
    {"conformance", "host_device_pointer", check_host_device_pointer},
    {"conformance", "kernel_lookup", check_kernel_lookup},
    {"conformance", "kernel_vector_add", check_kernel_vector_add},
    {"conformance", "launch_config_1d", check_launch_config_1d},
    {NULL, NULL, NULL},
};
