/* test_comm_no_nccl.c - without NCCL (METRALE_NCCL_PATH names a file that is not there),
 * CUDA communicators report MG_ERR_UNAVAILABLE with the loader's reason, and nothing crashes;
 * CPU communicators are unaffected. */
#include <stdlib.h>

#include "metrale/comm.h"
#include "test_util.h"

int main(void) {
    setenv("METRALE_NCCL_PATH", "/nonexistent/libnccl-for-test.so.2", 1);
    char reason[512] = "";
    CHECK(!mg_comm_available(MG_BACKEND_CUDA, reason, sizeof reason));
    mg_backend_probe probe;
    CHECK_OK(mg_backend_probe_kind(MG_BACKEND_CUDA, &probe));
    /* With the CUDA backend built, the reason is the loader's; without it, the build's. */
    CHECK(strstr(reason, probe.compiled_in ? "libnccl-for-test" : "this build") != NULL);
    mg_comm_id id;
    CHECK_STATUS(mg_comm_get_id(MG_BACKEND_CUDA, &id), MG_ERR_UNAVAILABLE);
    CHECK_MESSAGE(probe.compiled_in ? "libnccl-for-test" : "this build");
    /* With a GPU, creation over it is refused the same way before touching NCCL. */
    if (probe.usable) {
        mg_backend *b;
        CHECK_OK(mg_backend_open(MG_BACKEND_CUDA, 0, &b));
        mg_comm *c = NULL;
        CHECK_STATUS(mg_comm_create_local(&b, 1, NULL, &c), MG_ERR_UNAVAILABLE);
        CHECK_MESSAGE("libnccl-for-test");
        CHECK(c == NULL);
        CHECK_OK(mg_backend_close(b));
    }
    CHECK(mg_comm_available(MG_BACKEND_CPU, NULL, 0));
    CHECK_OK(mg_comm_get_id(MG_BACKEND_CPU, &id));
    return test_finish();
}
