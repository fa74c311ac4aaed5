/* test_concurrency_cpu_backend.c - the CPU backend under concurrent use (also run under
 * ThreadSanitizer): threads sharing one backend, each with its own stream, allocate, copy,
 * launch, capture and replay graphs, while other threads register and look up kernels and
 * read the counters. Every thread checks its own results. */
#include <pthread.h>
#include <stdatomic.h>

#include "metrale/cpu.h"
#include "metrale/gpu.h"
#include "metrale/launch.h"
#include "test_util.h"

enum { WORKERS = 4, ROUNDS = 20, N = 4099 };

static mg_backend *shared_backend;
static atomic_int worker_failures;
/* Allocation is refused while any stream of the backend captures, so workers allocate
 * before anyone captures and free after everyone is done. */
static pthread_barrier_t allocated, finished;

/* test:negate(ptr x, u32 n): x[i] = -x[i]. */
static mg_status kernel_negate(const mg_launch *l) {
    float *x = (float *)(uintptr_t)mg_launch_get_ptr(l, 0);
    uint32_t n = mg_launch_get_u32(l, 1);
    for (uint32_t i = 0; i < n; i++)
        x[i] = -x[i];
    return MG_OK;
}

#define WORKER_CHECK(cond)                                                                         \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "worker FAIL line %d: %s (%s)\n", __LINE__, #cond, mg_last_error());   \
            atomic_fetch_add(&worker_failures, 1);                                                 \
            goto done;                                                                             \
        }                                                                                          \
    } while (0)

static void *worker(void *arg) {
    unsigned seed = (unsigned)(uintptr_t)arg * 2654435761u + 1;
    mg_backend *b = shared_backend;
    mg_stream *s = NULL;
    mg_graph *g = NULL;
    mg_kernel *add = NULL;
    mg_devptr a = 0, bb = 0, out = 0;
    float *ha = malloc(N * sizeof(float)), *hb = malloc(N * sizeof(float));
    float *hout = malloc(N * sizeof(float));
    bool ready = ha && hb && hout && mg_stream_create(b, &s) == MG_OK &&
                 mg_kernel_lookup(b, "metrale", "vector_add", &add) == MG_OK &&
                 mg_alloc(b, N * sizeof(float), &a) == MG_OK &&
                 mg_alloc(b, N * sizeof(float), &bb) == MG_OK &&
                 mg_alloc(b, N * sizeof(float), &out) == MG_OK;
    pthread_barrier_wait(&allocated);
    WORKER_CHECK(ready);
    for (int round = 0; round < ROUNDS; round++) {
        for (int i = 0; i < N; i++) {
            seed = seed * 1103515245u + 12345u;
            ha[i] = (float)(seed >> 8) / 65536.0f;
            hb[i] = (float)round - (float)i;
        }
        WORKER_CHECK(mg_copy_h2d_async(b, a, ha, N * sizeof(float), s) == MG_OK);
        WORKER_CHECK(mg_copy_h2d_async(b, bb, hb, N * sizeof(float), s) == MG_OK);
        mg_dim3 grid, block;
        mg_launch_config_1d(N, 128, &grid, &block);
        mg_launch l;
        mg_launch_init(&l, grid, block, 0);
        mg_launch_arg_ptr(&l, a);
        mg_launch_arg_ptr(&l, bb);
        mg_launch_arg_ptr(&l, out);
        mg_launch_arg_u32(&l, N);
        /* Odd rounds go through a captured graph, replayed twice. */
        if (round % 2) {
            WORKER_CHECK(mg_graph_begin_capture(s) == MG_OK);
            WORKER_CHECK(mg_launch_run(b, add, s, &l) == MG_OK);
            WORKER_CHECK(mg_graph_end_capture(s, &g) == MG_OK);
            WORKER_CHECK(mg_graph_launch(g, s) == MG_OK);
            WORKER_CHECK(mg_graph_launch(g, s) == MG_OK);
        } else {
            WORKER_CHECK(mg_launch_run(b, add, s, &l) == MG_OK);
        }
        WORKER_CHECK(mg_copy_d2h_async(b, hout, out, N * sizeof(float), s) == MG_OK);
        WORKER_CHECK(mg_stream_synchronize(s) == MG_OK);
        for (int i = 0; i < N; i++)
            WORKER_CHECK(hout[i] == ha[i] + hb[i]);
        mg_graph_destroy(g);
        g = NULL;
    }
done:
    if (s && g == NULL) {
        bool capturing = false;
        mg_stream_is_capturing(s, &capturing);
        if (capturing)
            mg_graph_abort_capture(s);
    }
    mg_graph_destroy(g);
    pthread_barrier_wait(&finished);
    mg_stream_destroy(s);
    mg_kernel_release(add);
    mg_free(b, a);
    mg_free(b, bb);
    mg_free(b, out);
    free(ha);
    free(hb);
    free(hout);
    return NULL;
}

/* Registers and looks up kernels on a second backend while the workers run. */
static void *registrar(void *arg) {
    mg_backend *b = arg;
    char name[32];
    for (int i = 0; i < 50; i++) {
        snprintf(name, sizeof name, "negate_%d", i % 5);
        if (mg_cpu_kernel_register("test", name, kernel_negate) != MG_OK)
            atomic_fetch_add(&worker_failures, 1);
        mg_kernel *k = NULL;
        if (mg_kernel_lookup(b, "test", name, &k) != MG_OK)
            atomic_fetch_add(&worker_failures, 1);
        else
            mg_kernel_release(k);
        mg_cpu_counters c;
        if (mg_cpu_get_counters(shared_backend, &c) != MG_OK)
            atomic_fetch_add(&worker_failures, 1);
    }
    return NULL;
}

int main(void) {
    test_seed();
    mg_backend *second = NULL;
    CHECK_OK(mg_backend_open(MG_BACKEND_CPU, 6, &shared_backend));
    CHECK_OK(mg_backend_open(MG_BACKEND_CPU, 7, &second));
    if (!shared_backend || !second)
        return test_finish();
    pthread_barrier_init(&allocated, NULL, WORKERS);
    pthread_barrier_init(&finished, NULL, WORKERS);
    pthread_t threads[WORKERS + 1];
    for (int i = 0; i < WORKERS; i++)
        CHECK(pthread_create(&threads[i], NULL, worker, (void *)(uintptr_t)(i + 1)) == 0);
    CHECK(pthread_create(&threads[WORKERS], NULL, registrar, second) == 0);
    for (int i = 0; i <= WORKERS; i++)
        pthread_join(threads[i], NULL);
    CHECK(atomic_load(&worker_failures) == 0);
    mg_cpu_counters c;
    CHECK_OK(mg_cpu_get_counters(shared_backend, &c));
    pthread_barrier_destroy(&allocated);
    pthread_barrier_destroy(&finished);
    CHECK(c.alloc == (uint64_t)WORKERS * 3 && c.free == c.alloc);
    CHECK(c.launch == (uint64_t)WORKERS * ROUNDS);
    CHECK(c.graph_launch == (uint64_t)WORKERS * ROUNDS); /* two per odd round */
    uint64_t live, count;
    CHECK_OK(mg_ledger_live(shared_backend, &live, &count));
    CHECK(live == 0 && count == 0);
    CHECK_OK(mg_backend_close(second));
    CHECK_OK(mg_backend_close(shared_backend));
    return test_finish();
}
