/* test_concurrency_op_cache.c - many threads looking up kernels, asking for scratch (a tag
 * of their own, a tag all share, scratch private to their stream, growing as they go) and
 * passing gates at once, then destroying their streams while others still ask (also run
 * under ThreadSanitizer: make test-tsan). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>

#include "metrale/gpu.h"
#include "op_cache.h"
#include "test_util.h"

enum { THREADS = 8, ROUNDS = 200 };

static mg_backend *backend;
static mg_kernel *seen[THREADS];
static atomic_int once_passes, first_n_passes, failures;
static pthread_barrier_t start;

/* Scratch for `tag` of at least `bytes`, written over its whole requested length on `s` (the
 * CPU backend checks the range, so a buffer smaller than asked fails the memset). */
static void use_scratch(mg_op_cache *c, const char *tag, size_t bytes, mg_stream *s,
                        bool stream_private, bool write) {
    mg_devptr p = 0;
    mg_status st = stream_private ? mg_op_cache_stream_scratch(c, tag, bytes, s, &p)
                                  : mg_op_cache_scratch(c, tag, bytes, s, &p);
    if (st || !p || (write && mg_memset_async(backend, p, 0x5A, bytes, s)))
        atomic_fetch_add(&failures, 1);
}

static void *worker(void *arg) {
    int id = (int)(intptr_t)arg;
    mg_op_cache *c = mg_backend_op_cache(backend);
    mg_stream *s = NULL;
    if (mg_stream_create(backend, &s))
        atomic_fetch_add(&failures, 1);
    char own[32], private_tag[32];
    snprintf(own, sizeof own, "concurrency.own.%d", id);
    snprintf(private_tag, sizeof private_tag, "concurrency.private.%d", id);
    pthread_barrier_wait(&start);
    for (int r = 0; r < ROUNDS; r++) {
        /* growing every few rounds, so buffers are retired and reclaimed while others ask */
        size_t bytes = 64 * (size_t)(1 + r / 4 + id);
        use_scratch(c, own, bytes, s, false, true);
        use_scratch(c, private_tag, bytes, s, true, true);
        use_scratch(c, "concurrency.shared", bytes, s, false, false); /* shared: not written */
        mg_kernel *k = NULL;
        if (mg_kernel_lookup(backend, "metrale", r % 2 ? "vector_add" : "empty_kernel", &k) ||
            mg_kernel_release(k))
            atomic_fetch_add(&failures, 1);
        if (r % 2)
            seen[id] = k;
        once_passes += mg_gate_once("concurrency.once");
        first_n_passes += mg_gate_first_n("concurrency.first_n", 5);
    }
    /* frees the stream's private scratch while other threads still ask for theirs */
    if (s && mg_stream_destroy(s))
        atomic_fetch_add(&failures, 1);
    return NULL;
}

int main(void) {
    test_seed();
    CHECK_OK(mg_backend_open(MG_BACKEND_CPU, 2, &backend));
    if (!backend)
        return test_finish();
    pthread_barrier_init(&start, NULL, THREADS);
    pthread_t t[THREADS];
    for (int i = 0; i < THREADS; i++)
        pthread_create(&t[i], NULL, worker, (void *)(intptr_t)i);
    for (int i = 0; i < THREADS; i++)
        pthread_join(t[i], NULL);
    pthread_barrier_destroy(&start);
    CHECK(atomic_load(&failures) == 0);
    for (int i = 1; i < THREADS; i++)
        CHECK(seen[i] == seen[0]); /* one handle, however many threads raced for it */
    CHECK(mg_op_cache_kernel_count(mg_backend_op_cache(backend)) == 2);
    CHECK(atomic_load(&once_passes) == 1);
    CHECK(atomic_load(&first_n_passes) == 5);
    /* one slot per thread's own tag and the shared one; the private ones went with their
     * streams, and everything retired has been reclaimed */
    size_t live = 0, retired = 0;
    mg_op_cache_scratch_counts(mg_backend_op_cache(backend), &live, &retired);
    CHECK(live == THREADS + 1 && retired == 0);
    uint64_t live_bytes = 0, live_count = 0;
    CHECK_OK(mg_ledger_live(backend, &live_bytes, &live_count));
    CHECK(live_count == THREADS + 1);
    CHECK_OK(mg_backend_close(backend));
    return test_finish();
}
