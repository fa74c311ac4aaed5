/* test_core_dispatch.c - core rules that are not a backend's: builder errors reported at
 * launch with their reason, device ranges of mapped host blocks and of registered caller-owned
 * host memory on a strict backend, and the backend-wide capture rule. */
#include "metrale/gpu.h"
#include "metrale/launch.h"
#include "metrale/ops_elementwise.h"
#include "test_util.h"

static unsigned char *registered_block; /* freed by main after the backend closes */

static void test_builder_error_reason(mg_backend *b) {
    mg_kernel *k = NULL;
    CHECK_OK(mg_kernel_lookup(b, "metrale", "vector_add", &k));
    mg_launch l;
    mg_launch_init(&l, (mg_dim3){1, 1, 1}, (mg_dim3){32, 1, 1}, 0);
    for (int i = 0; i < MG_LAUNCH_MAX_ARGS + 3; i++)
        mg_launch_arg_u32(&l, (uint32_t)i);
    mg_clear_error();
    CHECK_STATUS(mg_launch_run(b, k, NULL, &l), MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("more than 64 arguments");
    CHECK_MESSAGE("metrale:vector_add");
    CHECK_OK(mg_kernel_release(k));
}

static void test_mapped_host_ranges(mg_backend *b) {
    if (!mg_backend_supports(b, MG_CAP_HOST_DEVICE_POINTER))
        return;
    size_t bytes = (size_t)test_rand_range(1000, 5000);
    unsigned char *host = NULL;
    CHECK_OK(mg_host_alloc(b, bytes, (void **)&host));
    if (!host)
        return;
    test_fill_random(host, bytes);
    mg_devptr dev = 0, mapped = 0;
    CHECK_OK(mg_alloc(b, bytes, &dev));
    /* Before the device address is handed out, it is not a device range of this backend. */
    CHECK_STATUS(mg_copy_d2d(b, dev, (mg_devptr)(uintptr_t)host, bytes), MG_ERR_INVALID_ARGUMENT);
    CHECK_OK(mg_host_device_pointer(b, host, &mapped));
    CHECK(mapped != 0);
    CHECK_OK(mg_copy_d2d(b, dev, mapped + 1, bytes - 1)); /* interior range of the block */
    unsigned char *back = malloc(bytes);
    CHECK_OK(mg_copy_d2h(b, back, dev, bytes - 1));
    CHECK(back && memcmp(back, host + 1, bytes - 1) == 0);
    free(back);
    CHECK_STATUS(mg_copy_d2d(b, dev, mapped + 1, bytes), MG_ERR_INVALID_ARGUMENT); /* overrun */
    CHECK_OK(mg_host_free(b, host));
    CHECK_STATUS(mg_copy_d2d(b, dev, mapped, 16), MG_ERR_INVALID_ARGUMENT); /* freed */
    CHECK_OK(mg_free(b, dev));
}

/* mg_host_register: caller-owned memory becomes a device range (copies and ops read and write
 * it in place), overruns and overlaps are refused, unregistering ends it, and neither
 * unregistering nor closing the backend frees it (ASan would see a double free). */
static void test_registered_host_ranges(mg_backend *b) {
    size_t bytes = (size_t)test_rand_range(1000, 5000);
    unsigned char *host = malloc(bytes + 64), *back = malloc(bytes);
    if (!host || !back) {
        free(host);
        free(back);
        CHECK(false);
        return;
    }
    test_fill_random(host, bytes + 64);
    mg_devptr dev = 0, reg = 0, other = 0;
    CHECK_OK(mg_alloc(b, bytes, &dev));
    CHECK_STATUS(mg_copy_d2d(b, dev, (mg_devptr)(uintptr_t)host, bytes), MG_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(mg_host_register(b, NULL, bytes, &reg), MG_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(mg_host_register(b, host, 0, &reg), MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("zero bytes");
    CHECK_STATUS(mg_host_register(b, host, bytes, NULL), MG_ERR_INVALID_ARGUMENT);
    CHECK_OK(mg_host_register(b, host, bytes, &reg));
    CHECK(reg == (mg_devptr)(uintptr_t)host);
    CHECK_STATUS(mg_host_register(b, host + 8, 16, &other), MG_ERR_INVALID_ARGUMENT);
    CHECK_MESSAGE("overlaps");
    CHECK_OK(mg_copy_d2d(b, dev, reg + 1, bytes - 1));
    CHECK_OK(mg_copy_d2h(b, back, dev, bytes - 1));
    CHECK(memcmp(back, host + 1, bytes - 1) == 0);
    CHECK_STATUS(mg_copy_d2d(b, dev, reg + 1, bytes), MG_ERR_INVALID_ARGUMENT); /* overrun */
    /* An op writes registered memory in place: argmax of one FP32 row into its first bytes. */
    float *row = (float *)(void *)(host + 64);
    for (int i = 0; i < 16; i++)
        row[i] = (float)(i == 11 ? 3.0 : -1.0);
    CHECK_OK(mg_argmax_f32(b, NULL, 1, 16, reg + 64, 16, reg));
    CHECK_OK(mg_stream_synchronize(mg_stream_default(b)));
    int32_t id;
    memcpy(&id, host, sizeof id);
    CHECK(id == 11);
    CHECK_STATUS(mg_host_unregister(b, host + 1), MG_ERR_INVALID_ARGUMENT);
    CHECK_OK(mg_host_unregister(b, host));
    CHECK_STATUS(mg_copy_d2d(b, dev, reg, 16), MG_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(mg_host_unregister(b, host), MG_ERR_INVALID_ARGUMENT);
    CHECK_OK(mg_host_register(b, host, bytes, &reg)); /* left registered: close must not free */
    CHECK_OK(mg_free(b, dev));
    free(back);
    registered_block = host;
}

static void test_capture_rule_is_backend_wide(mg_backend *b) {
    if (!mg_backend_supports(b, MG_CAP_GRAPHS))
        return;
    mg_stream *capturing = NULL, *other = NULL;
    CHECK_OK(mg_stream_create(b, &capturing));
    CHECK_OK(mg_stream_create(b, &other));
    mg_devptr p = 0;
    CHECK_OK(mg_alloc(b, 64, &p));
    CHECK_OK(mg_graph_begin_capture(capturing));
    mg_devptr q = 0;
    CHECK_STATUS(mg_alloc(b, 64, &q), MG_ERR_CAPTURING);
    CHECK_STATUS(mg_memset(b, p, 1, 64), MG_ERR_CAPTURING);
    CHECK_OK(mg_memset_async(b, p, 1, 64, other)); /* async work elsewhere is fine */
    CHECK_OK(mg_stream_synchronize(other));        /* and so is waiting for another stream */
    CHECK_STATUS(mg_stream_synchronize(capturing), MG_ERR_CAPTURING);
    CHECK_OK(mg_graph_abort_capture(capturing));
    CHECK_OK(mg_alloc(b, 64, &q));
    CHECK_OK(mg_free(b, q));
    CHECK_OK(mg_free(b, p));
    CHECK_OK(mg_stream_destroy(capturing));
    CHECK_OK(mg_stream_destroy(other));
}

/* The Metal backend is compiled in everywhere; without libobjc and Metal (this machine, unless
 * the test double is named) the probe says why and opening fails with that reason. */
static void test_metal_unavailable(void) {
    mg_backend_probe probe;
    CHECK_OK(mg_backend_probe_kind(MG_BACKEND_METAL, &probe));
    CHECK(probe.compiled_in);
    if (probe.usable)
        return; /* a Metal runtime (or the test double) is present: nothing to refuse */
    CHECK(probe.device_count == 0 && probe.reason[0]);
    mg_backend *m = (mg_backend *)1;
    CHECK_STATUS(mg_backend_open(MG_BACKEND_METAL, 0, &m), MG_ERR_UNAVAILABLE);
    CHECK_MESSAGE("metal backend");
    CHECK(m == NULL);
}

int main(void) {
    test_seed();
    test_metal_unavailable();
    mg_backend *b = NULL;
    CHECK_OK(mg_backend_open(MG_BACKEND_CPU, 3, &b));
    if (!b)
        return test_finish();
    test_builder_error_reason(b);
    test_mapped_host_ranges(b);
    test_registered_host_ranges(b);
    test_capture_rule_is_backend_wide(b);
    CHECK_OK(mg_backend_close(b));
    free(registered_block);
    return test_finish();
}
