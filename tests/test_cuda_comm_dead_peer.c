/* test_cuda_comm_dead_peer.c - a peer that dies mid-collective does not hang the survivor.
 *
 * Two processes, one GPU each, meet through mg_comm_create_rank (the id goes over a pipe) and
 * run a checked all-reduce. Then the survivor (rank 0) enqueues a second all-reduce, which
 * cannot complete, and the parent kills the other rank with SIGKILL. The survivor's
 * mg_comm_wait must return MG_ERR_DEVICE within its timeout (plus the abort's slack), and the
 * survivor must then destroy its communicator, close its backend and exit; the parent fails
 * the test if it does not exit in time. Skipped (77) without two GPUs or NCCL.
 *
 * The parent makes no CUDA call (a CUDA context does not survive fork): the children probe. */
#include <errno.h>
#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "metrale/comm.h"
#include "test_util.h"

#define TIMEOUT_MS 5000u
#define ABORT_SLACK_MS 20000u

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void say(int fd, char c) {
    if (write(fd, &c, 1) != 1)
        _exit(1);
}

static bool read_all(int fd, void *p, size_t bytes) {
    uint8_t *b = p;
    while (bytes) {
        ssize_t n = read(fd, b, bytes);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return false;
        b += n;
        bytes -= (size_t)n;
    }
    return true;
}

/* A child's life: rank 0 is the survivor, rank 1 the victim. `id_pipe` carries the id from
 * rank 0 to rank 1 (all zero bytes: skip); `status` tells the parent 'K' (skip), 'V' (victim
 * ready to die), 'S' (survivor's collective in flight). */
static int run_child(int rank, int id_pipe[2], int status) {
    mg_comm_id id;
    memset(&id, 0, sizeof id);
    if (rank == 0) {
        close(id_pipe[0]);
        mg_backend_probe probe;
        mg_backend_probe_kind(MG_BACKEND_CUDA, &probe);
        char reason[512] = "";
        bool usable = probe.compiled_in && probe.usable && probe.device_count >= 2;
        if (!usable || !mg_comm_available(MG_BACKEND_CUDA, reason, sizeof reason) ||
            mg_comm_get_id(MG_BACKEND_CUDA, &id) != MG_OK) {
            printf("test_cuda_comm_dead_peer: skipped: needs two CUDA devices and NCCL: %s\n",
                   !probe.compiled_in ? "not compiled in"
                   : !probe.usable    ? probe.reason
                   : !usable          ? "only one device"
                                      : reason);
            fflush(stdout);
            memset(&id, 0, sizeof id);
            if (write(id_pipe[1], &id, sizeof id) != (ssize_t)sizeof id)
                return 1;
            say(status, 'K');
            return 77;
        }
        if (write(id_pipe[1], &id, sizeof id) != (ssize_t)sizeof id)
            return 1;
    } else {
        close(id_pipe[1]);
        mg_comm_id zero;
        memset(&zero, 0, sizeof zero);
        if (!read_all(id_pipe[0], &id, sizeof id))
            return 1;
        if (!memcmp(&id, &zero, sizeof id))
            return 77;
    }
    mg_backend *b;
    mg_comm *c;
    mg_comm_options options = {.timeout_ms = TIMEOUT_MS};
    mg_devptr x;
    float host[1000];
    for (int i = 0; i < 1000; i++)
        host[i] = (float)(rank + 1) * (float)i;
    if (mg_backend_open(MG_BACKEND_CUDA, rank, &b) ||
        mg_comm_create_rank(b, &id, 2, rank, &options, &c) || mg_alloc(b, sizeof host, &x) ||
        mg_copy_h2d(b, x, host, sizeof host) ||
        mg_comm_all_reduce(c, NULL, x, x, 1000, MG_DTYPE_F32, MG_COMM_SUM) ||
        mg_comm_wait(c, NULL) || mg_copy_d2h(b, host, x, sizeof host)) {
        fprintf(stderr, "FAIL rank %d: setup: %s\n", rank, mg_last_error());
        return 1;
    }
    for (int i = 0; i < 1000; i++)
        if (host[i] != 3.0f * (float)i) {
            fprintf(stderr, "FAIL rank %d: all-reduce [%d] = %g, want %g\n", rank, i, host[i],
                    3.0 * i);
            return 1;
        }
    if (rank == 1) {
        say(status, 'V');
        for (;;)
            pause(); /* until killed */
    }
    if (mg_comm_all_reduce(c, NULL, x, x, 1000, MG_DTYPE_F32, MG_COMM_SUM)) {
        fprintf(stderr, "FAIL survivor: the second all-reduce was refused: %s\n", mg_last_error());
        return 1;
    }
    say(status, 'S');
    double t0 = now_ms();
    mg_status st = mg_comm_wait(c, NULL);
    double waited = now_ms() - t0;
    printf("survivor: mg_comm_wait returned %s after %.0f ms: %s\n", mg_status_name(st), waited,
           mg_last_error());
    int rc = 0;
    if (st != MG_ERR_DEVICE) {
        fprintf(stderr, "FAIL survivor: expected MG_ERR_DEVICE\n");
        rc = 1;
    }
    if (waited > TIMEOUT_MS + ABORT_SLACK_MS) {
        fprintf(stderr, "FAIL survivor: waited %.0f ms, more than %u + %u\n", waited, TIMEOUT_MS,
                ABORT_SLACK_MS);
        rc = 1;
    }
    if (mg_comm_check(c) != MG_ERR_DEVICE) {
        fprintf(stderr, "FAIL survivor: the communicator is not marked failed\n");
        rc = 1;
    }
    mg_comm_destroy(c);
    mg_backend_close(b); /* the aborted collective must not keep the device busy */
    printf("survivor: closed %.0f ms after the wait began\n", now_ms() - t0);
    return rc;
}

int main(void) {
    int id_pipe[2], status_pipe[2];
    if (pipe(id_pipe) || pipe(status_pipe)) {
        perror("pipe");
        return 1;
    }
    fflush(stdout);
    pid_t pids[2];
    for (int rank = 0; rank < 2; rank++) {
        pids[rank] = fork();
        if (pids[rank] < 0) {
            perror("fork");
            return 1;
        }
        if (pids[rank] == 0) {
            close(status_pipe[0]);
            int rc = run_child(rank, id_pipe, status_pipe[1]);
            fflush(stdout);
            fflush(stderr);
            _exit(rc);
        }
    }
    close(id_pipe[0]);
    close(id_pipe[1]);
    close(status_pipe[1]);
    bool victim_ready = false, survivor_waiting = false;
    while (!(victim_ready && survivor_waiting)) {
        char c;
        if (!read_all(status_pipe[0], &c, 1)) { /* a child exited early */
            int ws;
            waitpid(pids[0], &ws, 0);
            kill(pids[1], SIGKILL);
            waitpid(pids[1], NULL, 0);
            if (WIFEXITED(ws) && WEXITSTATUS(ws) == 77)
                return 77;
            fprintf(stderr, "FAIL: a rank exited before the collective (survivor status %d)\n",
                    WIFEXITED(ws) ? WEXITSTATUS(ws) : -1);
            return 1;
        }
        if (c == 'K') {
            waitpid(pids[0], NULL, 0);
            waitpid(pids[1], NULL, 0);
            return 77;
        }
        victim_ready |= c == 'V';
        survivor_waiting |= c == 'S';
    }
    struct timespec in_flight = {0, 300 * 1000000L};
    nanosleep(&in_flight, NULL);
    CHECK(kill(pids[1], SIGKILL) == 0);
    waitpid(pids[1], NULL, 0);
    double deadline = now_ms() + TIMEOUT_MS + 2 * ABORT_SLACK_MS;
    int ws = 0;
    pid_t done = 0;
    while ((done = waitpid(pids[0], &ws, WNOHANG)) == 0 && now_ms() < deadline) {
        struct timespec tick = {0, 50 * 1000000L};
        nanosleep(&tick, NULL);
    }
    if (done == 0) {
        kill(pids[0], SIGKILL);
        waitpid(pids[0], NULL, 0);
    }
    CHECK(done == pids[0]); /* the survivor exited by itself */
    CHECK(done == pids[0] && WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
    return test_finish();
}
