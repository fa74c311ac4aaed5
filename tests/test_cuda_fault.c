/*
 * test_cuda_fault.c - sticky device faults on the CUDA backend (skipped without a device).
 * A deliberately faulting kernel (an illegal address) runs in a child process, since the
 * CUDA context is lost afterwards; the child checks that the fault is reported with the
 * kernel's name, that every later call fails fast with it while free paths still succeed,
 * and that reopening after close reports the fault instead of crashing. A second child
 * runs with METRALE_DEBUG_SYNC_KERNELS=1 and checks the launch itself reports the fault,
 * naming the kernel and its arguments. Children are started with exec, never plain fork,
 * because a CUDA process cannot be forked.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "test_cuda_util.h"

#define BAD_ADDRESS 0x10 /* in the unmapped first page of the device address space */

static mg_status launch_fault(mg_backend *b, mg_kernel *k) {
    mg_launch l;
    mg_launch_init(&l, (mg_dim3){1, 1, 1}, (mg_dim3){1, 1, 1}, 0);
    mg_launch_arg_ptr(&l, BAD_ADDRESS);
    return mg_launch_run(b, k, NULL, &l);
}

static int fault_child(void) {
    mg_backend *b = cuda_test_open_or_skip("fault child");
    mg_devptr kept = 0, other = 0;
    CHECK_OK(mg_alloc(b, 1 << 20, &kept));
    CHECK_OK(mg_alloc(b, 4096, &other));
    mg_kernel *k = cuda_test_kernel(b, "fault_kernel");
    if (!k)
        return test_finish();
    CHECK_OK(launch_fault(b, k)); /* asynchronous: the fault shows at the next sync */
    CHECK_STATUS(mg_stream_synchronize(mg_stream_default(b)), MG_ERR_DEVICE_FAULT);
    CHECK_MESSAGE("ILLEGAL_ADDRESS");
    CHECK_MESSAGE("metrale:fault_kernel");
    printf("  reported: %s\n", mg_last_error());

    /* Fail fast with the original message on every later call... */
    mg_devptr p = 0;
    CHECK_STATUS(mg_alloc(b, 4096, &p), MG_ERR_DEVICE_FAULT);
    CHECK_MESSAGE("fault_kernel");
    CHECK_STATUS(mg_memset(b, kept, 0, 16), MG_ERR_DEVICE_FAULT);
    mg_stream *s = NULL;
    CHECK_STATUS(mg_stream_create(b, &s), MG_ERR_DEVICE_FAULT);
    CHECK_STATUS(launch_fault(b, k), MG_ERR_DEVICE_FAULT);
    /* ...while free paths still succeed. */
    CHECK_OK(mg_free(b, kept));
    CHECK_OK(mg_kernel_release(k));
    mg_status closed = mg_backend_close(b); /* frees `other` */
    CHECK(closed == MG_OK || closed == MG_ERR_DEVICE_FAULT);

    /* The driver keeps the fault for the rest of the process: reopening is refused with
     * the cause, without crashing (CUDA documents that the process must be relaunched). */
    mg_backend *again = (mg_backend *)(uintptr_t)1;
    CHECK_STATUS(mg_backend_open(MG_BACKEND_CUDA, 0, &again), MG_ERR_DEVICE_FAULT);
    CHECK_MESSAGE("ILLEGAL_ADDRESS");
    CHECK_MESSAGE("restart");
    CHECK(again == NULL);
    return test_finish();
}

static int debug_sync_child(void) {
    mg_backend *b = cuda_test_open_or_skip("debug-sync child");
    mg_kernel *k = cuda_test_kernel(b, "fault_kernel");
    if (k) {
        CHECK_STATUS(launch_fault(b, k), MG_ERR_DEVICE_FAULT);
        CHECK_MESSAGE("METRALE_DEBUG_SYNC_KERNELS");
        CHECK_MESSAGE("fault_kernel");
        CHECK_MESSAGE("ptr=0x10");
        printf("  reported: %s\n", mg_last_error());
        CHECK_OK(mg_kernel_release(k));
    }
    mg_backend_close(b);
    return test_finish();
}

/* Runs this program again with `mode`; returns its exit status (77: skipped). */
static int run_child(const char *self, const char *mode, const char *debug_sync) {
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        if (debug_sync)
            setenv("METRALE_DEBUG_SYNC_KERNELS", debug_sync, 1);
        else
            unsetenv("METRALE_DEBUG_SYNC_KERNELS");
        execl(self, self, mode, (char *)NULL);
        _exit(127);
    }
    int status = 0;
    if (pid < 0 || waitpid(pid, &status, 0) != pid)
        return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "--fault-child"))
        return fault_child();
    if (argc > 1 && !strcmp(argv[1], "--debug-sync-child"))
        return debug_sync_child();
    mg_backend_probe probe;
    mg_backend_probe_kind(MG_BACKEND_CUDA, &probe);
    if (!probe.compiled_in || !probe.usable) {
        printf("test_cuda_fault: skipped: the CUDA backend is not usable here: %s\n",
               probe.compiled_in ? probe.reason : "not compiled in");
        return TEST_SKIP_EXIT;
    }
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    CHECK(n > 0);
    if (n <= 0)
        return test_finish();
    self[n] = '\0';
    int status = run_child(self, "--fault-child", NULL);
    printf("fault child exited with %d\n", status);
    CHECK(status == 0);
    status = run_child(self, "--debug-sync-child", "1");
    printf("debug-sync child exited with %d\n", status);
    CHECK(status == 0);
    return test_finish();
}
