/*
 * test_concurrency_switches.c - many threads making the first call of a switch at once
 * (metrale/switches.h), run under ThreadSanitizer by `make test-tsan`.
 *
 * Each round runs in a fresh child process (the switches resolve once per process): the
 * child starts THREADS threads that wait on a barrier and then all call setters and readers
 * of every switch at the same moment. Properties checked in the child:
 *  - every reader of a switch, in every thread, returns the same value;
 *  - at most one setter call per switch reports that it published;
 *  - the value is the published one when a setter won, else the environment's.
 */
#include <pthread.h>
#include <stdatomic.h>

#include "metrale/switches.h"
#include "utils_test_support.h"

#define THREADS 16
#define READS_PER_THREAD 200

typedef struct thread_result {
    bool hermetic, midchunk, ckpt; /* the first value each reader saw */
    bool consistent;               /* every later read agreed with the first */
    bool hermetic_published;       /* this thread's setter call won */
    bool midchunk_published;
    mg_tristate midchunk_value; /* what this thread tried to publish */
} thread_result;

static pthread_barrier_t start_line;
static thread_result results[THREADS];

static void *racer(void *arg) {
    int id = (int)(intptr_t)arg;
    thread_result *r = &results[id];
    /* A third of the threads publish, the rest only read; publishers alternate values. */
    bool publisher = id % 3 == 0;
    r->midchunk_value = (id / 3) % 2 ? MG_TRISTATE_TRUE : MG_TRISTATE_FALSE;
    pthread_barrier_wait(&start_line);
    if (publisher) {
        r->hermetic_published = mg_set_hermetic(true);
        r->midchunk_published = mg_set_ssm_tail_midchunk(r->midchunk_value);
    }
    r->hermetic = mg_hermetic_enabled();
    r->midchunk = mg_ssm_tail_midchunk_enabled();
    r->ckpt = mg_ssm_tail_ckpt_enabled();
    r->consistent = true;
    for (int i = 0; i < READS_PER_THREAD; i++) {
        if (mg_hermetic_enabled() != r->hermetic || mg_ssm_tail_midchunk_enabled() != r->midchunk ||
            mg_ssm_tail_ckpt_enabled() != r->ckpt)
            r->consistent = false;
    }
    return NULL;
}

static int child_main(void) {
    const char *env_hermetic = getenv("METRALE_HERMETIC");
    const char *env_midchunk = getenv("METRALE_SSM_TAIL_MIDCHUNK");
    const char *env_ckpt = getenv("METRALE_SSM_TAIL_CKPT");
    bool hermetic_env = env_hermetic && strcmp(env_hermetic, "1") == 0;
    bool midchunk_env = !(env_midchunk && strcmp(env_midchunk, "0") == 0);
    bool ckpt_env = env_ckpt && strcmp(env_ckpt, "1") == 0;

    pthread_t threads[THREADS];
    pthread_barrier_init(&start_line, NULL, THREADS);
    for (int i = 0; i < THREADS; i++)
        if (pthread_create(&threads[i], NULL, racer, (void *)(intptr_t)i) != 0) {
            fprintf(stderr, "child: pthread_create failed\n");
            return 2;
        }
    for (int i = 0; i < THREADS; i++)
        pthread_join(threads[i], NULL);
    pthread_barrier_destroy(&start_line);

    int hermetic_winners = 0, midchunk_winners = 0;
    mg_tristate midchunk_won = MG_TRISTATE_UNSET;
    for (int i = 0; i < THREADS; i++) {
        CHECKF(results[i].consistent, "thread %d saw a switch change value", i);
        CHECKF(results[i].hermetic == results[0].hermetic, "thread %d hermetic differs", i);
        CHECKF(results[i].midchunk == results[0].midchunk, "thread %d midchunk differs", i);
        CHECKF(results[i].ckpt == results[0].ckpt, "thread %d ckpt differs", i);
        hermetic_winners += results[i].hermetic_published;
        if (results[i].midchunk_published) {
            midchunk_winners++;
            midchunk_won = results[i].midchunk_value;
        }
    }
    CHECKF(hermetic_winners <= 1, "%d hermetic setters published", hermetic_winners);
    CHECKF(midchunk_winners <= 1, "%d midchunk setters published", midchunk_winners);
    CHECK(results[0].hermetic == (hermetic_winners ? true : hermetic_env));
    CHECK(results[0].midchunk ==
          (midchunk_winners ? midchunk_won == MG_TRISTATE_TRUE : midchunk_env));
    CHECK(results[0].ckpt == ckpt_env);
    return test_failures ? 1 : 0;
}

int main(int argc, char **argv) {
    if (argc >= 2 && strcmp(argv[1], "child") == 0)
        return child_main();

    static const char *const envs[][4] = {
        {NULL},
        {"METRALE_HERMETIC=1", "METRALE_SSM_TAIL_MIDCHUNK=0", "METRALE_SSM_TAIL_CKPT=1", NULL},
        {"METRALE_SSM_TAIL_MIDCHUNK=0", NULL},
        {"METRALE_HERMETIC=0", "METRALE_SSM_TAIL_CKPT=0", NULL},
    };
    const int rounds_per_env = 12;
    const char *args[] = {"child", NULL};
    for (size_t e = 0; e < sizeof envs / sizeof envs[0]; e++)
        for (int round = 0; round < rounds_per_env; round++) {
            int rc = test_run_self(args, "METRALE_", envs[e]);
            CHECKF(rc == 0, "environment set %zu, round %d: child exit %d", e, round, rc);
        }
    return test_finish();
}
