/*
 * test_host_allocation_failures.c - the library's host allocations fail one at a time.
 *
 * CMakeLists.txt links this program with -Wl,--wrap for malloc, calloc, realloc,
 * aligned_alloc, strdup and free; the library is linked statically, so its calls land in the
 * wrappers below. A sweep runs one library call with its n-th host allocation failing, for
 * n = 1, 2, ... until a run completes without reaching an injected failure. Every run that
 * met a failure must return MG_ERR_OUT_OF_MEMORY with a message (or, where the library
 * documents that it absorbs the failure, MG_OK with a correct result) and must leave the
 * objects it was given usable. The wrappers count live blocks: once a test has closed its
 * backend, every block taken on the way is freed again, except the process-wide tables that
 * are kept by design (registered kernels, the pinned registry's array). A failed call may
 * leave a table it grew bigger, so blocks are balanced per test, not per call.
 */
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "metrale/arena.h"
#include "metrale/cpu.h"
#include "metrale/dtype.h"
#include "metrale/gpu.h"
#include "metrale/launch.h"
#include "metrale/ops.h"
#include "metrale/ops_attention.h"
#include "metrale/ops_gemm.h"
#include "metrale/pinned.h"
#include "metrale/timing.h"
#include "utils_test_support.h"

/* ------------------------------------------------------------------ wrapped allocator */

void *__real_malloc(size_t bytes);
void *__real_calloc(size_t count, size_t bytes);
void *__real_realloc(void *p, size_t bytes);
void *__real_aligned_alloc(size_t alignment, size_t bytes);
char *__real_strdup(const char *s);
void __real_free(void *p);

void *__wrap_malloc(size_t bytes);
void *__wrap_calloc(size_t count, size_t bytes);
void *__wrap_realloc(void *p, size_t bytes);
void *__wrap_aligned_alloc(size_t alignment, size_t bytes);
char *__wrap_strdup(const char *s);
void __wrap_free(void *p);

static _Atomic uint64_t fail_countdown; /* 0: off; n: the n-th allocation from now fails */
static atomic_bool failure_injected;
static _Atomic int64_t live_blocks;      /* blocks allocated through the wrappers, not yet freed */
static _Atomic uint64_t largest_request; /* bytes of the largest allocation since reset */

static bool inject_failure(void) {
    uint64_t n = atomic_load(&fail_countdown);
    while (n) {
        if (atomic_compare_exchange_weak(&fail_countdown, &n, n - 1)) {
            if (n == 1) {
                atomic_store(&failure_injected, true);
                return true;
            }
            return false;
        }
    }
    return false;
}

static void *counted(void *p) {
    if (p)
        atomic_fetch_add(&live_blocks, 1);
    return p;
}

static void note_request(size_t bytes) {
    uint64_t seen = atomic_load(&largest_request);
    while (bytes > seen && !atomic_compare_exchange_weak(&largest_request, &seen, bytes)) {
    }
}

void *__wrap_malloc(size_t bytes) {
    note_request(bytes);
    return inject_failure() ? NULL : counted(__real_malloc(bytes));
}

void *__wrap_calloc(size_t count, size_t bytes) {
    note_request(count * bytes);
    return inject_failure() ? NULL : counted(__real_calloc(count, bytes));
}

void *__wrap_realloc(void *p, size_t bytes) {
    note_request(bytes);
    if (inject_failure())
        return NULL;
    void *q = __real_realloc(p, bytes);
    return p ? q : counted(q);
}

void *__wrap_aligned_alloc(size_t alignment, size_t bytes) {
    return inject_failure() ? NULL : counted(__real_aligned_alloc(alignment, bytes));
}

char *__wrap_strdup(const char *s) {
    return inject_failure() ? NULL : counted(__real_strdup(s));
}

void __wrap_free(void *p) {
    if (p)
        atomic_fetch_sub(&live_blocks, 1);
    __real_free(p);
}

/* ------------------------------------------------------------------ the sweep */

typedef struct attempt {
    const char *name;
    /* The call under test. */
    mg_status (*call)(void *ctx);
    /* Releases what a successful call made, and checks that a failed one left its inputs
     * usable. Runs with injection off. */
    void (*settle)(void *ctx, mg_status st);
    void *ctx;
    /* The library absorbs these failures by design: MG_OK is a correct answer too. */
    bool failure_absorbed;
} attempt;

#define SWEEP_LIMIT 400

/* Returns how many host allocations the successful run made. */
static uint64_t sweep(const attempt *a) {
    for (uint64_t n = 1; n <= SWEEP_LIMIT; n++) {
        mg_clear_error();
        atomic_store(&failure_injected, false);
        atomic_store(&fail_countdown, n);
        mg_status st = a->call(a->ctx);
        atomic_store(&fail_countdown, 0);
        bool injected = atomic_load(&failure_injected);
        if (!injected) {
            CHECKF(st == MG_OK, "%s: uninjected run returned %s: %s", a->name, mg_status_name(st),
                   mg_last_error());
            a->settle(a->ctx, st);
            return n - 1;
        }
        if (st != MG_OK || !a->failure_absorbed) {
            CHECKF(st == MG_ERR_OUT_OF_MEMORY, "%s with allocation %llu failing returned %s: %s",
                   a->name, (unsigned long long)n, mg_status_name(st), mg_last_error());
            CHECKF(mg_last_error()[0] != '\0', "%s: no message", a->name);
        }
        a->settle(a->ctx, st);
    }
    CHECKF(false, "%s: still failing after %d injected failures", a->name, SWEEP_LIMIT);
    return SWEEP_LIMIT;
}

/* Every host block taken since `start` (live_blocks then) is freed, but for `kept` blocks
 * of process-wide tables. */
static void check_balanced(const char *test, int64_t start, int64_t kept) {
    int64_t now = atomic_load(&live_blocks);
    CHECKF(now - start == kept, "%s: %lld host blocks still live, %lld expected", test,
           (long long)(now - start), (long long)kept);
}

/* ------------------------------------------------------------------ backends */

typedef struct backend_ctx {
    int device;
    mg_backend *b;
} backend_ctx;

static mg_status open_backend(void *ctx) {
    backend_ctx *c = ctx;
    return mg_backend_open(MG_BACKEND_CPU, c->device, &c->b);
}

static void settle_backend(void *ctx, mg_status st) {
    backend_ctx *c = ctx;
    if (st) {
        CHECK(c->b == NULL);
        /* the device was released: it opens again */
        CHECK_OK(mg_backend_open(MG_BACKEND_CPU, c->device, &c->b));
    }
    CHECK_OK(mg_backend_close(c->b));
    c->b = NULL;
}

static void test_backend_open(void) {
    int64_t start = atomic_load(&live_blocks);
    backend_ctx c = {.device = 5};
    uint64_t allocations =
        sweep(&(attempt){"mg_backend_open", open_backend, settle_backend, &c, false});
    CHECKF(allocations >= 4, "mg_backend_open made %llu host allocations",
           (unsigned long long)allocations);
    check_balanced("test_backend_open", start, 0);
}

/* ------------------------------------------------------------------ streams, events, blocks */

typedef struct handle_ctx {
    mg_backend *b;
    mg_stream *stream;
    mg_event *event;
    void *host;
    mg_devptr device; /* mg_alloc's result; a scratch buffer for the other sweeps */
} handle_ctx;

static mg_status create_stream(void *ctx) {
    handle_ctx *c = ctx;
    return mg_stream_create(c->b, &c->stream);
}

static void settle_stream(void *ctx, mg_status st) {
    handle_ctx *c = ctx;
    if (st) {
        CHECK(c->stream == NULL);
        return;
    }
    CHECK_OK(mg_memset_async(c->b, c->device, 7, 64, c->stream)); /* the stream works */
    CHECK_OK(mg_stream_destroy(c->stream));
    c->stream = NULL;
}

static mg_status create_event(void *ctx) {
    handle_ctx *c = ctx;
    return mg_event_create(c->b, &c->event);
}

static void settle_event(void *ctx, mg_status st) {
    handle_ctx *c = ctx;
    if (st) {
        CHECK(c->event == NULL);
        return;
    }
    CHECK_OK(mg_event_record(c->event, NULL));
    CHECK_OK(mg_event_destroy(c->event));
    c->event = NULL;
}

static mg_status alloc_host(void *ctx) {
    handle_ctx *c = ctx;
    return mg_host_alloc(c->b, 200, &c->host);
}

static void settle_host(void *ctx, mg_status st) {
    handle_ctx *c = ctx;
    if (st) {
        CHECK(c->host == NULL);
        return;
    }
    /* mapped, usable as a device range, then freed */
    mg_devptr mapped = 0;
    CHECK_OK(mg_host_device_pointer(c->b, c->host, &mapped));
    CHECK_OK(mg_memset(c->b, mapped, 0x5a, 200));
    CHECK(((uint8_t *)c->host)[199] == 0x5a);
    CHECK_OK(mg_host_free(c->b, c->host));
    c->host = NULL;
}

static mg_status alloc_device(void *ctx) {
    handle_ctx *c = ctx;
    return mg_alloc(c->b, 1000, &c->device);
}

static void settle_device(void *ctx, mg_status st) {
    handle_ctx *c = ctx;
    if (st) {
        CHECK(c->device == 0);
        return;
    }
    CHECK_OK(mg_memset(c->b, c->device, 1, 1000));
    CHECK_OK(mg_free(c->b, c->device));
    c->device = 0;
}

/* Sweeps each creation with `fill` objects of its kind already live, so the backend's and
 * the core's tables are at a growth boundary (they start at 16 or 64 and double). */
static void test_handles(void) {
    int64_t start = atomic_load(&live_blocks);
    handle_ctx c = {0};
    CHECK_OK(mg_backend_open(MG_BACKEND_CPU, 5, &c.b));
    mg_devptr scratch = 0;
    CHECK_OK(mg_alloc(c.b, 64, &scratch));
    static const size_t fills[] = {0, 16, 64};
    for (size_t f = 0; f < sizeof fills / sizeof fills[0]; f++) {
        mg_stream *streams[64];
        mg_event *events[64];
        void *hosts[64];
        mg_devptr devices[64];
        size_t fill = fills[f];
        /* one device allocation fewer: the scratch buffer is live too */
        for (size_t i = 0; i < fill; i++) {
            CHECK_OK(mg_stream_create(c.b, &streams[i]));
            CHECK_OK(mg_event_create(c.b, &events[i]));
            CHECK_OK(mg_host_alloc(c.b, 64, &hosts[i]));
            if (i + 1 < fill)
                CHECK_OK(mg_alloc(c.b, 64, &devices[i]));
        }
        c.device = scratch;
        sweep(&(attempt){"mg_stream_create", create_stream, settle_stream, &c, false});
        sweep(&(attempt){"mg_event_create", create_event, settle_event, &c, false});
        sweep(&(attempt){"mg_host_alloc", alloc_host, settle_host, &c, false});
        c.device = 0;
        sweep(&(attempt){"mg_alloc", alloc_device, settle_device, &c, false});
        for (size_t i = 0; i < fill; i++) {
            CHECK_OK(mg_stream_destroy(streams[i]));
            CHECK_OK(mg_event_destroy(events[i]));
            CHECK_OK(mg_host_free(c.b, hosts[i]));
            if (i + 1 < fill)
                CHECK_OK(mg_free(c.b, devices[i]));
        }
    }
    CHECK_OK(mg_free(c.b, scratch));
    CHECK_OK(mg_backend_close(c.b));
    check_balanced("test_handles", start, 0);
}

/* ------------------------------------------------------------------ captures and graphs */

#define SLOTS 160
#define RECORDED_COPIES 36 /* with the launch, the node list grows at 16 and 32 nodes */

typedef struct capture_ctx {
    mg_backend *b;
    mg_stream *s;
    mg_kernel *vector_add;
    mg_devptr slots;   /* SLOTS x 8 bytes: every attempted copy has its own */
    mg_devptr x, y, z; /* vector_add operands, 16 floats each */
    uint32_t next_slot;
    bool recorded[SLOTS]; /* whether the copy into slot i was recorded */
    mg_graph *graph;
} capture_ctx;

static uint64_t slot_pattern(uint32_t slot) {
    return 0x0101010101010101ull * (slot + 1);
}

/* One pageable copy into a slot of its own, recorded into the capture (the backend snapshots
 * the source, and its node list grows every 16 nodes). */
static mg_status record_copy(void *ctx) {
    capture_ctx *c = ctx;
    if (c->next_slot >= SLOTS)
        return MG_ERR_INTERNAL;
    uint64_t pattern = slot_pattern(c->next_slot);
    return mg_copy_h2d_async(c->b, c->slots + 8 * c->next_slot, &pattern, 8, c->s);
}

static void settle_record_copy(void *ctx, mg_status st) {
    capture_ctx *c = ctx;
    bool capturing = false;
    CHECK_OK(mg_stream_is_capturing(c->s, &capturing));
    CHECK(capturing); /* a failed record leaves the capture going */
    if (c->next_slot < SLOTS)
        c->recorded[c->next_slot++] = st == MG_OK;
}

static mg_status record_launch(void *ctx) {
    capture_ctx *c = ctx;
    mg_launch l;
    mg_launch_init(&l, (mg_dim3){1, 1, 1}, (mg_dim3){16, 1, 1}, 0);
    mg_launch_arg_ptr(&l, c->x);
    mg_launch_arg_ptr(&l, c->y);
    mg_launch_arg_ptr(&l, c->z);
    mg_launch_arg_u32(&l, 16);
    return mg_launch_run(c->b, c->vector_add, c->s, &l);
}

static void settle_record_launch(void *ctx, mg_status st) {
    (void)ctx;
    (void)st;
}

static void test_capture_recording(void) {
    int64_t start = atomic_load(&live_blocks);
    capture_ctx c = {0};
    CHECK_OK(mg_backend_open(MG_BACKEND_CPU, 5, &c.b));
    CHECK_OK(mg_stream_create(c.b, &c.s));
    CHECK_OK(mg_kernel_lookup(c.b, "metrale", "vector_add", &c.vector_add));
    CHECK_OK(mg_alloc(c.b, 8 * SLOTS, &c.slots));
    CHECK_OK(mg_alloc(c.b, 64, &c.x));
    CHECK_OK(mg_alloc(c.b, 64, &c.y));
    CHECK_OK(mg_alloc(c.b, 64, &c.z));
    float ones[16], twos[16], result[16];
    for (int i = 0; i < 16; i++)
        ones[i] = 1.0f, twos[i] = 2.0f;
    CHECK_OK(mg_copy_h2d(c.b, c.x, ones, 64));
    CHECK_OK(mg_copy_h2d(c.b, c.y, twos, 64));
    CHECK_OK(mg_memset(c.b, c.z, 0, 64));
    CHECK_OK(mg_memset(c.b, c.slots, 0xee, 8 * SLOTS));

    CHECK_OK(mg_graph_begin_capture(c.s));
    sweep(&(attempt){"recording a launch", record_launch, settle_record_launch, &c, false});
    for (uint32_t i = 0; i < RECORDED_COPIES; i++)
        sweep(&(attempt){"recording a pageable copy", record_copy, settle_record_copy, &c, false});
    CHECK_OK(mg_graph_end_capture(c.s, &c.graph));
    CHECK_OK(mg_graph_launch(c.graph, c.s));
    CHECK_OK(mg_stream_synchronize(c.s));

    /* exactly the recorded nodes ran: the successful copies and the launch */
    uint64_t slots[SLOTS];
    CHECK_OK(mg_copy_d2h(c.b, slots, c.slots, sizeof slots));
    uint32_t recorded = 0;
    for (uint32_t i = 0; i < SLOTS; i++) {
        recorded += c.recorded[i];
        CHECKF(slots[i] == (c.recorded[i] ? slot_pattern(i) : 0xeeeeeeeeeeeeeeeeull),
               "slot %u holds %#llx (recorded: %d)", i, (unsigned long long)slots[i],
               c.recorded[i]);
    }
    CHECK(recorded == RECORDED_COPIES);
    CHECK(c.next_slot > RECORDED_COPIES); /* some attempts failed */
    CHECK_OK(mg_copy_d2h(c.b, result, c.z, 64));
    CHECK(result[0] == 3.0f && result[15] == 3.0f);

    CHECK_OK(mg_kernel_release(c.vector_add));
    CHECK_OK(mg_graph_destroy(c.graph));
    CHECK_OK(mg_stream_destroy(c.s));
    CHECK_OK(mg_backend_close(c.b));
    check_balanced("test_capture_recording", start, 0);
}

typedef struct graph_ctx {
    mg_backend *b;
    mg_stream *s;
    mg_devptr d;
    mg_graph *source; /* launched into a capture */
    mg_graph *made;
} graph_ctx;

/* A whole capture: begin, one memset (the node list's first growth), end. */
static mg_status capture_graph(void *ctx) {
    graph_ctx *c = ctx;
    mg_status st = mg_graph_begin_capture(c->s);
    if (!st)
        st = mg_memset_async(c->b, c->d, 0x42, 32, c->s);
    if (!st)
        return mg_graph_end_capture(c->s, &c->made);
    mg_graph_abort_capture(c->s);
    return st;
}

/* A capture whose only work is launching `source`: the backend copies its nodes. */
static mg_status capture_graph_launch(void *ctx) {
    graph_ctx *c = ctx;
    mg_status st = mg_graph_begin_capture(c->s);
    if (!st)
        st = mg_graph_launch(c->source, c->s);
    if (!st)
        return mg_graph_end_capture(c->s, &c->made);
    mg_graph_abort_capture(c->s);
    return st;
}

static void settle_graph(void *ctx, mg_status st) {
    graph_ctx *c = ctx;
    bool capturing = true;
    CHECK_OK(mg_stream_is_capturing(c->s, &capturing));
    CHECK(!capturing);
    if (st) {
        CHECK(c->made == NULL);
        return;
    }
    uint8_t out[32];
    CHECK_OK(mg_memset(c->b, c->d, 0, 32));
    CHECK_OK(mg_graph_launch(c->made, c->s));
    CHECK_OK(mg_copy_d2h(c->b, out, c->d, 32));
    CHECK(out[0] == 0x42 && out[31] == 0x42);
    CHECK_OK(mg_graph_destroy(c->made));
    c->made = NULL;
}

static void test_graphs(void) {
    int64_t start = atomic_load(&live_blocks);
    graph_ctx c = {0};
    CHECK_OK(mg_backend_open(MG_BACKEND_CPU, 5, &c.b));
    CHECK_OK(mg_stream_create(c.b, &c.s));
    CHECK_OK(mg_alloc(c.b, 32, &c.d));
    sweep(&(attempt){"capturing a graph", capture_graph, settle_graph, &c, false});

    /* the source graph: a pageable copy (an owned snapshot) of 0x42 bytes */
    uint8_t pattern[32];
    memset(pattern, 0x42, sizeof pattern);
    CHECK_OK(mg_graph_begin_capture(c.s));
    CHECK_OK(mg_copy_h2d_async(c.b, c.d, pattern, 32, c.s));
    CHECK_OK(mg_graph_end_capture(c.s, &c.source));
    sweep(&(attempt){"launching a graph into a capture", capture_graph_launch, settle_graph, &c,
                     false});
    CHECK_OK(mg_graph_destroy(c.source));
    CHECK_OK(mg_backend_close(c.b));
    check_balanced("test_graphs", start, 0);
}

/* ------------------------------------------------------------------ kernels and the ledger */

/* A registered CPU kernel keeps its entry, module, function and full name for the process. */
#define KERNEL_REGISTRY_BLOCKS 4

static mg_status noop_kernel(const mg_launch *l) {
    (void)l;
    return MG_OK;
}

typedef struct kernel_ctx {
    mg_backend *b;
    char name[32];
    mg_kernel *k;
} kernel_ctx;

static mg_status lookup_kernel(void *ctx) {
    kernel_ctx *c = ctx;
    return mg_kernel_lookup(c->b, "alloc_failures", c->name, &c->k);
}

static void settle_lookup(void *ctx, mg_status st) {
    kernel_ctx *c = ctx;
    if (st) {
        CHECK(c->k == NULL);
        return;
    }
    CHECK(!strcmp(mg_kernel_name(c->k) + strlen("alloc_failures:"), c->name));
    CHECK_OK(mg_kernel_release(c->k));
    c->k = NULL;
}

static mg_status register_kernel(void *ctx) {
    kernel_ctx *c = ctx;
    return mg_cpu_kernel_register("alloc_failures_registered", c->name, noop_kernel);
}

static void settle_register(void *ctx, mg_status st) {
    kernel_ctx *c = ctx;
    mg_kernel *k = NULL;
    /* registered exactly when the call succeeded */
    CHECK_STATUS(mg_kernel_lookup(c->b, "alloc_failures_registered", c->name, &k),
                 st ? MG_ERR_NOT_FOUND : MG_OK);
    if (k)
        CHECK_OK(mg_kernel_release(k));
}

typedef struct sites_ctx {
    mg_backend *b;
    mg_ledger_site sites[4];
    size_t written;
} sites_ctx;

static mg_status top_sites(void *ctx) {
    sites_ctx *c = ctx;
    c->written = 99;
    return mg_ledger_top_sites(c->b, 0, c->sites, 4, &c->written);
}

static void settle_top_sites(void *ctx, mg_status st) {
    sites_ctx *c = ctx;
    if (!st) {
        CHECK(c->written == 2);
        CHECK(c->sites[0].bytes == 3000 && c->sites[0].count == 3);
        CHECK(c->sites[1].bytes == 512 && c->sites[1].count == 1);
    }
}

static void test_kernels_and_ledger(void) {
    int64_t start = atomic_load(&live_blocks);
    kernel_ctx k = {0};
    CHECK_OK(mg_backend_open(MG_BACKEND_CPU, 5, &k.b));
    /* 40 fresh names: the op cache's kernel table grows past its first 64 slots' half */
    for (int i = 0; i < 40; i++) {
        snprintf(k.name, sizeof k.name, "k%d", i);
        CHECK_OK(mg_cpu_kernel_register("alloc_failures", k.name, noop_kernel));
        sweep(&(attempt){"mg_kernel_lookup", lookup_kernel, settle_lookup, &k, false});
    }
    for (int i = 0; i < 3; i++) {
        snprintf(k.name, sizeof k.name, "r%d", i);
        uint64_t n = sweep(
            &(attempt){"mg_cpu_kernel_register", register_kernel, settle_register, &k, false});
        CHECKF(n == KERNEL_REGISTRY_BLOCKS, "registering a name made %llu host allocations",
               (unsigned long long)n);
    }

    sites_ctx s = {.b = k.b};
    mg_devptr d[4];
    for (int i = 0; i < 3; i++)
        CHECK_OK(mg_alloc(s.b, 1000, &d[i]));
    CHECK_OK(mg_alloc(s.b, 512, &d[3]));
    sweep(&(attempt){"mg_ledger_top_sites", top_sites, settle_top_sites, &s, false});
    for (int i = 0; i < 4; i++)
        CHECK_OK(mg_free(s.b, d[i]));
    CHECK_OK(mg_backend_close(k.b));
    check_balanced("test_kernels_and_ledger", start, KERNEL_REGISTRY_BLOCKS * (40 + 3));
}

/* ------------------------------------------------------------------ arenas */

typedef struct arena_ctx {
    mg_backend *b;
    mg_arena_plan *plan;
    mg_arena *arena;
    size_t added;
    bool limit_toggle;
} arena_ctx;

static mg_status create_plan(void *ctx) {
    arena_ctx *c = ctx;
    return mg_arena_plan_create(&c->plan);
}

static void settle_plan(void *ctx, mg_status st) {
    arena_ctx *c = ctx;
    if (!st)
        CHECK(mg_arena_plan_count(c->plan) == 0);
    mg_arena_plan_destroy(c->plan);
    c->plan = NULL;
}

static mg_status add_buffer(void *ctx) {
    arena_ctx *c = ctx;
    char name[16];
    snprintf(name, sizeof name, "b%zu", c->added);
    mg_arena_lifetime life = {(uint32_t)c->added % 5, (uint32_t)c->added % 5 + 2};
    return mg_arena_plan_add(c->plan, name, 1000 + 100 * c->added, 0, &life, NULL);
}

static void settle_add(void *ctx, mg_status st) {
    arena_ctx *c = ctx;
    if (!st)
        c->added++;
    CHECK(mg_arena_plan_count(c->plan) == c->added); /* unchanged by a failure */
}

/* Every pack runs on an invalidated layout: toggling the chunk limit invalidates it. */
static mg_status pack_plan(void *ctx) {
    arena_ctx *c = ctx;
    c->limit_toggle = !c->limit_toggle;
    mg_status st = mg_arena_plan_set_max_chunk_bytes(c->plan, c->limit_toggle ? 1ull << 40 : 0);
    return st ? st : mg_arena_plan_pack(c->plan);
}

static void settle_pack(void *ctx, mg_status st) {
    arena_ctx *c = ctx;
    mg_arena_summary s;
    CHECK_OK(mg_arena_plan_summary(c->plan, &s)); /* packs now if the failure left it unpacked */
    CHECK(s.buffer_count == c->added && s.arena_bytes >= s.peak_live_bytes);
    (void)st;
}

/* Every creation packs first (a limit toggled between two values of several chunks), so the
 * allocations of a run are the same sequence whichever failed in the run before. */
static mg_status create_arena(void *ctx) {
    arena_ctx *c = ctx;
    c->limit_toggle = !c->limit_toggle;
    mg_status st = mg_arena_plan_set_max_chunk_bytes(c->plan, c->limit_toggle ? 12000 : 12001);
    return st ? st : mg_arena_create(c->b, c->plan, &c->arena);
}

static void settle_arena(void *ctx, mg_status st) {
    arena_ctx *c = ctx;
    uint64_t live_bytes = 1, live_count = 1;
    if (st) {
        CHECK(c->arena == NULL);
        CHECK_OK(mg_ledger_live(c->b, &live_bytes, &live_count));
        CHECK(live_bytes == 0 && live_count == 0); /* no chunk left behind */
        return;
    }
    mg_devptr p = 0;
    uint64_t bytes = 0;
    CHECK_OK(mg_arena_find(c->arena, "b0", &p, &bytes));
    CHECK(p != 0 && bytes == 1000);
    CHECK_OK(mg_memset(c->b, p, 3, bytes));
    CHECK_OK(mg_arena_destroy(c->arena));
    c->arena = NULL;
}

static void test_arenas(void) {
    int64_t start = atomic_load(&live_blocks);
    arena_ctx c = {0};
    sweep(&(attempt){"mg_arena_plan_create", create_plan, settle_plan, &c, false});
    CHECK_OK(mg_arena_plan_create(&c.plan));
    for (int i = 0; i < 40; i++) /* the plan's buffer table grows at 32 */
        sweep(&(attempt){"mg_arena_plan_add", add_buffer, settle_add, &c, false});
    sweep(&(attempt){"mg_arena_plan_pack", pack_plan, settle_pack, &c, false});
    CHECK_OK(mg_backend_open(MG_BACKEND_CPU, 5, &c.b));
    sweep(&(attempt){"mg_arena_create", create_arena, settle_arena, &c, false});
    mg_arena_plan_destroy(c.plan);
    CHECK_OK(mg_backend_close(c.b));
    check_balanced("test_arenas", start, 0);
}

/* ------------------------------------------------------------------ timing */

typedef struct timing_ctx {
    mg_backend *b;
    mg_timing *t;
    uint32_t lane;
    uint64_t spans; /* harvested so far */
} timing_ctx;

static mg_status create_timing(void *ctx) {
    timing_ctx *c = ctx;
    mg_timing_options o = {.level = MG_TELEMETRY_BASIC, .pool_pairs = 3, .trace_capacity = 4};
    return mg_timing_create(c->b, &o, &c->t);
}

static void settle_timing(void *ctx, mg_status st) {
    timing_ctx *c = ctx;
    if (st) {
        CHECK(c->t == NULL);
        CHECK_MESSAGE("mg_timing_create");
        return;
    }
    CHECK_OK(mg_timing_destroy(c->t));
    c->t = NULL;
}

/* One finished span, then a harvest: its histogram is allocated with the first sample. */
static mg_status harvest_one(void *ctx) {
    timing_ctx *c = ctx;
    mg_timing_span span = 0;
    mg_status st = mg_timing_lane_begin(c->t, c->lane, NULL, &span);
    if (!st)
        st = mg_timing_span_end(c->t, span, NULL);
    size_t harvested = 0;
    if (!st)
        st = mg_timing_harvest(c->t, &harvested);
    return st ? st : harvested == 1 ? MG_OK : MG_ERR_INTERNAL;
}

static void settle_harvest(void *ctx, mg_status st) {
    timing_ctx *c = ctx;
    mg_timing_summary s;
    CHECK_OK(mg_timing_summary_get(c->t, 0, &s));
    CHECK(s.count == c->spans + (st == MG_OK)); /* every harvested span is counted */
    CHECK(s.min_us <= s.max_us && s.total_us >= s.max_us && s.p50_us <= s.max_us);
    c->spans = s.count;
}

/* ------------------------------------------------------------------ the BF16 GEMM */

/* The CPU's BF16 GEMM (cpu_avx2 where the CPU has it): without memory for a packed weight block
 * the block runs on the reference, which gives the same bits, so a failure is absorbed. */
#define GEMM_M 3u
#define GEMM_N 40u /* two blocks of cpu_avx2's 32 rows, the second partial */
#define GEMM_K 24u
typedef struct gemm_ctx {
    mg_backend *b;
    mg_devptr act, weight, out;
    float expected[GEMM_M * GEMM_N];
} gemm_ctx;

static mg_status run_gemm(void *ctx) {
    gemm_ctx *c = ctx;
    return mg_gemm_bf16(c->b, NULL, GEMM_M, GEMM_N, GEMM_K, c->act, c->weight, c->out, MG_DTYPE_F32,
                        GEMM_N);
}

static void settle_gemm(void *ctx, mg_status st) {
    gemm_ctx *c = ctx;
    float got[GEMM_M * GEMM_N];
    if (!st) {
        CHECK_OK(mg_copy_d2h(c->b, got, c->out, sizeof got));
        CHECK(memcmp(got, c->expected, sizeof got) == 0);
    }
    CHECK_OK(mg_memset(c->b, c->out, 0xff, sizeof got));
}

static void test_gemm(void) {
    int64_t start = atomic_load(&live_blocks);
    gemm_ctx c = {0};
    uint16_t act[GEMM_M * GEMM_K], weight[GEMM_N * GEMM_K];
    for (uint32_t i = 0; i < GEMM_M * GEMM_K; i++)
        act[i] = mg_f32_to_bf16((float)((int)(i * 7 % 13) - 6) / 4.0f);
    for (uint32_t i = 0; i < GEMM_N * GEMM_K; i++)
        weight[i] = mg_f32_to_bf16((float)((int)(i * 5 % 11) - 5) / 8.0f);
    CHECK_OK(mg_backend_open(MG_BACKEND_CPU, 5, &c.b));
    CHECK_OK(mg_alloc(c.b, sizeof act, &c.act));
    CHECK_OK(mg_alloc(c.b, sizeof weight, &c.weight));
    CHECK_OK(mg_alloc(c.b, sizeof c.expected, &c.out));
    CHECK_OK(mg_copy_h2d(c.b, c.act, act, sizeof act));
    CHECK_OK(mg_copy_h2d(c.b, c.weight, weight, sizeof weight));
    CHECK_OK(run_gemm(&c));
    CHECK_OK(mg_copy_d2h(c.b, c.expected, c.out, sizeof c.expected));
    CHECK_OK(mg_memset(c.b, c.out, 0xff, sizeof c.expected));
    sweep(&(attempt){"mg_gemm_bf16 on the CPU", run_gemm, settle_gemm, &c, true});
    mg_free(c.b, c.act);
    mg_free(c.b, c.weight);
    mg_free(c.b, c.out);
    CHECK_OK(mg_backend_close(c.b));
    check_balanced("test_gemm", start, 0);
}

static void test_timing(void) {
    int64_t start = atomic_load(&live_blocks);
    timing_ctx c = {0};
    CHECK_OK(mg_backend_open(MG_BACKEND_CPU, 5, &c.b));
    sweep(&(attempt){"mg_timing_create", create_timing, settle_timing, &c, false});
    CHECK_OK(mg_timing_create(c.b, NULL, &c.t));
    CHECK_OK(mg_timing_lane(c.t, "decode", &c.lane));
    /* a histogram that cannot be allocated loses the percentile, never the span */
    sweep(&(attempt){"harvesting a span", harvest_one, settle_harvest, &c, true});
    CHECK_OK(mg_timing_destroy(c.t));
    CHECK_OK(mg_backend_close(c.b));
    check_balanced("test_timing", start, 0);
}

/* ------------------------------------------------------------------ pinned registry */

typedef struct pinned_ctx {
    const char *base;
} pinned_ctx;

static mg_status register_range(void *ctx) {
    pinned_ctx *c = ctx;
    return mg_pinned_register(c->base, 16);
}

static void settle_range(void *ctx, mg_status st) {
    pinned_ctx *c = ctx;
    CHECK(mg_pinned_contains(c->base, 16) == (st == MG_OK));
    if (!st)
        CHECK_OK(mg_pinned_unregister(c->base));
}

static void test_pinned_registry(void) {
    int64_t start = atomic_load(&live_blocks);
    static char arena[65 * 64];
    size_t before = mg_pinned_count();
    CHECK(before == 0);
    for (int i = 0; i < 64; i++) /* the registry's first 64 entries are full */
        CHECK_OK(mg_pinned_register(arena + 64 * i, 16));
    pinned_ctx c = {arena + 64 * 64};
    sweep(&(attempt){"mg_pinned_register", register_range, settle_range, &c, false});
    for (int i = 0; i < 64; i++)
        CHECK_OK(mg_pinned_unregister(arena + 64 * i));
    CHECK(mg_pinned_count() == before);
    check_balanced("test_pinned_registry", start, 1);
}

/* ------------------------------------------------------------------ attention */

typedef struct attention_ctx {
    mg_backend *b;
    mg_attention_desc desc;
    int32_t qo[4], kv[4];
    uint32_t batch;
    mg_attention_plan *plan;
    mg_attention_tensors t;
} attention_ctx;

static mg_status create_attention_plan(void *ctx) {
    attention_ctx *c = ctx;
    return mg_attention_plan_create(c->b, &c->desc, c->qo, c->kv, c->batch, NULL, &c->plan);
}

static void settle_attention_plan(void *ctx, mg_status st) {
    attention_ctx *c = ctx;
    if (st) {
        CHECK(c->plan == NULL);
        return;
    }
    CHECK_OK(mg_attention_plan_destroy(c->plan));
    c->plan = NULL;
}

static mg_status update_attention_plan(void *ctx) {
    attention_ctx *c = ctx;
    return mg_attention_plan_update(c->plan, c->qo, c->kv, 3, NULL);
}

static void settle_attention_update(void *ctx, mg_status st) {
    attention_ctx *c = ctx;
    mg_attention_plan_info info;
    CHECK_OK(mg_attention_plan_get_info(c->plan, &info));
    CHECK(info.batch_size == (st ? 2u : 3u)); /* a failed update keeps the previous batch */
    if (!st)                                  /* back to two requests for the next run */
        CHECK_OK(mg_attention_plan_update(c->plan, c->qo, c->kv, 2, NULL));
}

static mg_status run_attention(void *ctx) {
    attention_ctx *c = ctx;
    return mg_attention_run(c->plan, &c->t, NULL);
}

static void settle_attention_run(void *ctx, mg_status st) {
    attention_ctx *c = ctx;
    if (st)
        CHECK_MESSAGE("scratch");
    else {
        uint16_t o[5 * 2 * 8];
        CHECK_OK(mg_copy_d2h(c->b, o, c->t.o, sizeof o));
        /* v is all 1.0, so every output is exactly 1.0 */
        size_t wrong = 0;
        for (size_t i = 0; i < sizeof o / sizeof o[0]; i++)
            wrong += mg_bf16_to_f32(o[i]) != 1.0f;
        CHECK(wrong == 0);
    }
}

static void test_attention(void) {
    int64_t start = atomic_load(&live_blocks);
    attention_ctx c = {
        .desc = {.num_qo_heads = 2,
                 .num_kv_heads = 1,
                 .head_dim = 8,
                 .window_left = -1,
                 .sm_scale = 0.35f},
        .qo = {0, 3, 5, 5},
        .kv = {0, 4, 9, 9},
        .batch = 2,
    };
    CHECK_OK(mg_backend_open(MG_BACKEND_CPU, 5, &c.b));
    /* The op registry's per-backend statistics are best effort (a call whose statistics
     * cannot be allocated still runs): create them first, so the sweep sees the plan's own
     * allocations. */
    mg_op_stats stats;
    CHECK_OK(mg_op_stats_get(c.b, MG_OP_ATTENTION_RAGGED, &stats));
    sweep(&(attempt){"mg_attention_plan_create", create_attention_plan, settle_attention_plan, &c,
                     false});
    CHECK_OK(create_attention_plan(&c));
    sweep(&(attempt){"mg_attention_plan_update", update_attention_plan, settle_attention_update, &c,
                     false});

    uint16_t ones[9 * 8], q[5 * 2 * 8];
    for (size_t i = 0; i < sizeof ones / sizeof ones[0]; i++)
        ones[i] = mg_f32_to_bf16(1.0f);
    for (size_t i = 0; i < sizeof q / sizeof q[0]; i++)
        q[i] = mg_f32_to_bf16((float)(i % 7) * 0.25f);
    c.t.qo_rows = 5;
    c.t.kv_rows = 9;
    CHECK_OK(mg_alloc(c.b, sizeof q, &c.t.q));
    CHECK_OK(mg_alloc(c.b, sizeof q, &c.t.o));
    CHECK_OK(mg_alloc(c.b, sizeof ones, &c.t.k));
    CHECK_OK(mg_alloc(c.b, sizeof ones, &c.t.v));
    CHECK_OK(mg_copy_h2d(c.b, c.t.q, q, sizeof q));
    CHECK_OK(mg_copy_h2d(c.b, c.t.k, ones, sizeof ones));
    CHECK_OK(mg_copy_h2d(c.b, c.t.v, ones, sizeof ones));
    sweep(&(attempt){"mg_attention_run", run_attention, settle_attention_run, &c, false});
    CHECK_OK(mg_attention_plan_destroy(c.plan));
    CHECK_OK(mg_backend_close(c.b));
    check_balanced("test_attention", start, 0);
}

/* ------------------------------------------------------------------ handle churn */

/* A long-running process creates and destroys handles all the time (events, streams, graphs,
 * kernels of unloaded modules): the registry behind them stays as small as the handles alive,
 * however many have come and gone. */
static void test_handle_churn(void) {
    mg_backend *b = NULL;
    CHECK_OK(mg_backend_open(MG_BACKEND_CPU, 5, &b));
    mg_event *alive[8];
    for (int i = 0; i < 8; i++)
        CHECK_OK(mg_event_create(b, &alive[i]));
    atomic_store(&largest_request, 0);
    int failed = 0;
    for (int i = 0; i < 200000; i++) {
        mg_event *e = NULL;
        failed += mg_event_create(b, &e) != MG_OK;
        failed += mg_event_destroy(e) != MG_OK;
    }
    CHECK(failed == 0);
    uint64_t largest = atomic_load(&largest_request);
    CHECKF(largest <= 64 * 1024, "200000 short-lived handles grew a table to %llu bytes",
           (unsigned long long)largest);
    for (int i = 0; i < 8; i++)
        CHECK_OK(mg_event_destroy(alive[i]));
    CHECK_OK(mg_backend_close(b));
}

int main(void) {
    /* Once unarmed first: process-wide tables (handles, kernel registry) are made on first
     * use and kept, so the sweeps below see only per-call allocations. */
    mg_backend *warm = NULL;
    CHECK_OK(mg_backend_open(MG_BACKEND_CPU, 5, &warm));
    attention_ctx warm_attention = {
        .b = warm,
        .desc = {.num_qo_heads = 1,
                 .num_kv_heads = 1,
                 .head_dim = 8,
                 .window_left = -1,
                 .sm_scale = 1.0f},
        .qo = {0, 1},
        .kv = {0, 1},
        .batch = 1,
    };
    CHECK_OK(create_attention_plan(&warm_attention));
    CHECK_OK(mg_attention_plan_destroy(warm_attention.plan));
    CHECK_OK(mg_backend_close(warm));

    test_backend_open();
    test_handles();
    test_capture_recording();
    test_graphs();
    test_kernels_and_ledger();
    test_arenas();
    test_timing();
    test_gemm();
    test_pinned_registry();
    test_attention();
    test_handle_churn();
    return test_finish();
}
