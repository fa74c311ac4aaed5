/* test_metal_sequence.c - the Metal backend's host code against the test double
 * (metal_double.c): an allocation, copies, a launch and a graph replay, checked against a
 * float64 reference, and the messages they sent checked for what Metal requires: every
 * encoder ended before its command buffer is committed, every command buffer committed
 * before anything waits for it, no released object messaged, buffers alive while a command
 * buffer that uses them is in flight (one is freed between its launch and the wait). Then the
 * double itself is shown to catch each breach (a buffer released while a command buffer that
 * uses it is in flight included), so a clean record means something.
 * Run by ctest with METRALE_METAL_OBJC_LIBRARY and METRALE_METAL_FRAMEWORK naming the double. */
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "metrale/gpu.h"
#include "metrale/launch.h"

static int failures;
#define EXPECT(cond, ...)                                                                          \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            printf("FAIL %s:%d: ", __FILE__, __LINE__);                                            \
            printf(__VA_ARGS__);                                                                   \
            printf("\n");                                                                          \
            failures++;                                                                            \
        }                                                                                          \
    } while (0)
#define OK(call)                                                                                   \
    do {                                                                                           \
        mg_status st_ = (call);                                                                    \
        EXPECT(st_ == MG_OK, "%s: %s: %s", #call, mg_status_name(st_), mg_last_error());           \
    } while (0)

typedef struct {
    unsigned long location, length;
} ns_range;

static struct {
    size_t (*violations)(char *, size_t);
    void (*reset)(void);
    size_t (*log_count)(void);
    const char *(*log_entry)(size_t);
    void (*msg)(void); /* objc_msgSend, cast per call */
    void *(*pool_push)(void);
    void (*pool_pop)(void *);
    void *(*create_device)(void);
    const char *(*sel)(const char *);
} dbl;

/* Index of the first log entry at or after `from` equal to `text`, or -1. */
static long find_entry(size_t from, const char *text) {
    for (size_t i = from; i < dbl.log_count(); i++)
        if (strcmp(dbl.log_entry(i), text) == 0)
            return (long)i;
    return -1;
}

/* Every "commandBuffer#N waitUntilCompleted" has its commit before it, and every compute
 * encoder's endEncoding comes before the next commit after the encoder was made. */
static void check_order(void) {
    size_t n = dbl.log_count(), waits = 0, commits = 0, encoders = 0;
    for (size_t i = 0; i < n; i++) {
        const char *e = dbl.log_entry(i);
        int id;
        char what[96];
        if (sscanf(e, "commandBuffer#%d %95s", &id, what) == 2) {
            char commit[64];
            snprintf(commit, sizeof commit, "commandBuffer#%d commit", id);
            if (!strcmp(what, "waitUntilCompleted")) {
                waits++;
                long c = find_entry(0, commit);
                EXPECT(c >= 0 && (size_t)c < i, "log entry %zu: %s before its commit", i, e);
            }
            if (!strcmp(what, "commit"))
                commits++;
            if (!strcmp(what, "computeCommandEncoder")) {
                /* the encoder made here is the next computeEncoder#M messaged */
                for (size_t j = i + 1; j < n; j++) {
                    int enc;
                    if (sscanf(dbl.log_entry(j), "computeEncoder#%d", &enc) != 1)
                        continue;
                    encoders++;
                    char end[64];
                    snprintf(end, sizeof end, "computeEncoder#%d endEncoding", enc);
                    long ended = find_entry(j, end), committed = find_entry(i, commit);
                    EXPECT(ended >= 0 && committed >= 0 && ended < committed,
                           "computeEncoder#%d of commandBuffer#%d: endEncoding at %ld, commit at "
                           "%ld",
                           enc, id, ended, committed);
                    break;
                }
            }
        }
    }
    EXPECT(waits > 0 && commits > 0 && encoders > 0,
           "the workload sent %zu waits, %zu commits, %zu compute encoders", waits, commits,
           encoders);
}

static void fill(float *x, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        x[i] = (float)((seed >> 8) % 20001) / 1000.0f - 10.0f;
    }
}

static void workload(mg_backend *b) {
    enum { N = 1237 }; /* not a multiple of any threadgroup size */
    size_t bytes = N * sizeof(float);
    float *a = malloc(bytes), *bb = malloc(bytes), *out = malloc(bytes);
    fill(a, N, 1);
    fill(bb, N, 2);
    mg_devptr da, db, dout, dcopy;
    OK(mg_alloc(b, bytes, &da));
    OK(mg_alloc(b, bytes, &db));
    OK(mg_alloc(b, bytes, &dout));
    OK(mg_alloc(b, bytes, &dcopy));
    OK(mg_memset(b, dout, 0xFF, bytes)); /* poisoned: NaN until written */
    mg_stream *s;
    OK(mg_stream_create(b, &s));
    OK(mg_copy_h2d_async(b, da, a, bytes, s));
    OK(mg_copy_h2d_async(b, db, bb, bytes, s));
    mg_kernel *k;
    OK(mg_kernel_lookup(b, "metrale", "vector_add", &k));
    mg_launch l;
    mg_launch_init(&l, (mg_dim3){3, 1, 1}, (mg_dim3){128, 1, 1}, 0);
    mg_launch_arg_ptr(&l, da);
    mg_launch_arg_ptr(&l, db);
    mg_launch_arg_ptr(&l, dout);
    mg_launch_arg_u32(&l, N);
    OK(mg_launch_run(b, k, s, &l));
    OK(mg_copy_d2d_async(b, dcopy, dout, bytes, s));
    OK(mg_free(b, db)); /* in flight: the command buffer must keep it alive */
    OK(mg_stream_synchronize(s));
    OK(mg_copy_d2h(b, out, dcopy, bytes));
    int wrong = 0;
    for (size_t i = 0; i < N; i++)
        wrong += fabs((double)out[i] - ((double)a[i] + (double)bb[i])) > 1e-5;
    EXPECT(wrong == 0, "%d of %d sums wrong after the eager launch", wrong, N);

    /* A graph: fill, add into dout (a + a with db gone), copy; replayed twice. */
    OK(mg_alloc(b, bytes, &db));
    OK(mg_copy_h2d(b, db, a, bytes));
    OK(mg_graph_begin_capture(s));
    OK(mg_memset_async(b, dcopy, 0xFF, bytes, s));
    mg_launch_init(&l, (mg_dim3){2, 1, 1}, (mg_dim3){64, 1, 1}, 0);
    mg_launch_arg_ptr(&l, da);
    mg_launch_arg_ptr(&l, db);
    mg_launch_arg_ptr(&l, dout);
    mg_launch_arg_u32(&l, N);
    OK(mg_launch_run(b, k, s, &l));
    OK(mg_copy_d2d_async(b, dcopy, dout, bytes, s));
    mg_graph *g = NULL;
    OK(mg_graph_end_capture(s, &g));
    for (int replay = 0; replay < 2; replay++) {
        memset(out, 0, bytes);
        OK(mg_memset(b, dout, 0xFF, bytes));
        OK(mg_graph_launch(g, s));
        OK(mg_copy_d2h_async(b, out, dcopy, bytes, s));
        OK(mg_stream_synchronize(s));
        wrong = 0;
        for (size_t i = 0; i < N; i++)
            wrong += fabs((double)out[i] - 2.0 * (double)a[i]) > 1e-5;
        EXPECT(wrong == 0, "%d of %d sums wrong in graph replay %d", wrong, N, replay);
    }
    OK(mg_graph_destroy(g));
    OK(mg_stream_destroy(s));
    OK(mg_free(b, da));
    OK(mg_free(b, db));
    OK(mg_free(b, dout));
    OK(mg_free(b, dcopy));
    free(a);
    free(bb);
    free(out);
}

/* The double must report each breach it exists to catch. */
static void check_double_catches(void) {
    typedef void *(*msg0)(void *, const char *);
    msg0 send = (msg0)dbl.msg;
    size_t before = dbl.violations(NULL, 0);
    void *dev = dbl.create_device();
    void *queue = send(dev, dbl.sel("newCommandQueue"));
    void *pool = dbl.pool_push();
    void *cb = send(queue, dbl.sel("commandBuffer"));
    send(cb, dbl.sel("waitUntilCompleted")); /* 1: waited before commit */
    send(cb, dbl.sel("computeCommandEncoder"));
    send(cb, dbl.sel("commit")); /* 2: committed with the encoder open */
    dbl.pool_pop(pool);
    send(cb, dbl.sel("status"));           /* 3: messaged after the pool released it */
    send(queue, dbl.sel("commandBuffer")); /* 4: autoreleased with no pool */
    /* 5: a buffer released while a command buffer that uses it is in flight. The backend's
     * command buffers (`commandBuffer`) retain what they use, which the workload's mg_free
     * between launch and wait exercises; one made with unretained references does not, so
     * nothing keeps the buffer alive until the fill runs at commit. */
    typedef void *(*msg_new_buffer)(void *, const char *, unsigned long, unsigned long);
    typedef void (*msg_fill)(void *, const char *, void *, ns_range, unsigned char);
    pool = dbl.pool_push();
    void *buffer = ((msg_new_buffer)dbl.msg)(dev, dbl.sel("newBufferWithLength:options:"), 64, 0);
    void *unretained = send(queue, dbl.sel("commandBufferWithUnretainedReferences"));
    void *blit = send(unretained, dbl.sel("blitCommandEncoder"));
    ((msg_fill)dbl.msg)(blit, dbl.sel("fillBuffer:range:value:"), buffer, (ns_range){0, 64}, 7);
    send(blit, dbl.sel("endEncoding"));
    size_t before_release = dbl.violations(NULL, 0);
    send(buffer, dbl.sel("release"));
    EXPECT(dbl.violations(NULL, 0) == before_release,
           "releasing the last reference of a buffer is no breach by itself");
    send(unretained, dbl.sel("commit")); /* the fill runs now, on released memory */
    dbl.pool_pop(pool);
    char text[8192];
    size_t caught = dbl.violations(text, sizeof text) - before;
    EXPECT(caught == 5, "the double caught %zu of 5 planted breaches", caught);
    EXPECT(strstr(text, "already released") != NULL,
           "the released buffer in flight is not among the breaches caught:\n%s", text);
}

int main(void) {
    const char *path = getenv("METRALE_METAL_OBJC_LIBRARY");
    void *h = path ? dlopen(path, RTLD_NOW) : NULL;
    if (!h) {
        printf("METRALE_METAL_OBJC_LIBRARY must name the Metal test double: %s\n",
               path ? dlerror() : "unset");
        return 1;
    }
#define SYM(field, name) *(void **)&dbl.field = dlsym(h, name)
    SYM(violations, "metal_double_violations");
    SYM(reset, "metal_double_reset");
    SYM(log_count, "metal_double_log_count");
    SYM(log_entry, "metal_double_log_entry");
    SYM(msg, "objc_msgSend");
    SYM(pool_push, "objc_autoreleasePoolPush");
    SYM(pool_pop, "objc_autoreleasePoolPop");
    SYM(create_device, "MTLCreateSystemDefaultDevice");
    SYM(sel, "sel_registerName");
#undef SYM
    mg_backend *b = NULL;
    mg_status st = mg_backend_open(MG_BACKEND_METAL, 0, &b);
    if (st != MG_OK) {
        printf("FAIL: mg_backend_open(metal): %s: %s\n", mg_status_name(st), mg_last_error());
        return 1;
    }
    dbl.reset();
    workload(b);
    char text[8192];
    size_t v = dbl.violations(text, sizeof text);
    EXPECT(v == 0, "%zu breaches of Metal's rules:\n%s", v, text);
    check_order();
    OK(mg_backend_close(b));
    check_double_catches();
    printf("metal message sequence: %zu messages, %s\n", dbl.log_count(),
           failures ? "FAILED" : "ok");
    return failures ? 1 : 0;
}
