/* test_concurrency_op_cache.c - many threads looking up kernels, asking for scratch and
 * passing gates at once (also run under ThreadSanitizer: make test-tsan). */
#include <pthread.h>
#include <stdatomic.h>

#include "metrale/gpu.h"
#include "op_cache.h"
#include "test_util.h"

enum { THREADS = 8, ROUNDS = 200 };

static mg_backend *backend;
static mg_kernel *seen[THREADS];
static atomic_int once_passes, first_n_passes, failures;
static pthread_barrier_t start;

static void *worker(void *arg) {
    int id = (int)(intptr_t)arg;
    pthread_barrier_wait(&start);
    for (int r = 0; r < ROUNDS; r++) {
        mg_kernel *k = NULL;
        if (mg_kernel_lookup(backend, "metrale", r % 2 ? "vector_add" : "empty_kernel", &k) ||
            mg_kernel_release(k))
            atomic_fetch_add(&failures, 1);
        if (r % 2)
            seen[id] = k;
        once_passes += mg_gate_once("concurrency.once");
        first_n_passes += mg_gate_first_n("concurrency.first_n", 5);
    }
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
    CHECK_OK(mg_backend_close(backend));
    return test_finish();
}
