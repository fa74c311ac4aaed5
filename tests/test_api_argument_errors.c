/*
 * test_api_argument_errors.c - the argument checks of metrale/gpu.h that test_bad_input does
 * not reach: NULL outputs of every query and creation, handles that were destroyed (stale),
 * the kind and probe helpers, the module calls a CPU backend does not support, name lengths,
 * empty launch dimensions, the ledger's report and top sites, and closing a backend that still
 * holds captures, graphs, events, streams and host blocks. Each case asserts the status and
 * the words of the message; the positive cases compare against independent figures.
 */
#include <stdint.h>
#include <unistd.h>

#include "metrale/gpu.h"
#include "metrale/launch.h"
#include "metrale/ops.h"
#include "metrale/ops_attention.h"
#include "test_util.h"

/* A failing call: its status and a message naming the problem. */
#define CHECK_ERROR(expr, status, needle)                                                          \
    do {                                                                                           \
        mg_clear_error();                                                                          \
        CHECK_STATUS(expr, status);                                                                \
        CHECK_MESSAGE(needle);                                                                     \
    } while (0)

static void test_kinds_and_probes(void) {
    CHECK(!strcmp(mg_backend_kind_name(MG_BACKEND_CPU), "cpu"));
    CHECK(!strcmp(mg_backend_kind_name(MG_BACKEND_AUTO), "auto"));
    CHECK(!strcmp(mg_backend_kind_name((mg_backend_kind)7), "?"));
    mg_backend_kind kind = MG_BACKEND_CPU;
    CHECK_ERROR(mg_backend_kind_parse(NULL, &kind), MG_ERR_INVALID_ARGUMENT, "unknown backend ''");
    CHECK_ERROR(mg_backend_kind_parse("cpu", NULL), MG_ERR_INVALID_ARGUMENT, "expected cpu");
    CHECK_OK(mg_backend_kind_parse("metal", &kind));
    CHECK(kind == MG_BACKEND_METAL);

    mg_backend_probe probe;
    CHECK_ERROR(mg_backend_probe_kind(MG_BACKEND_CPU, NULL), MG_ERR_INVALID_ARGUMENT,
                "NULL output");
    CHECK_ERROR(mg_backend_probe_kind(MG_BACKEND_AUTO, &probe), MG_ERR_INVALID_ARGUMENT,
                "kind must be cpu, cuda or metal");
    CHECK_OK(mg_backend_probe_kind(MG_BACKEND_CPU, &probe));
    CHECK(probe.compiled_in && probe.usable && probe.device_count == 8);

    /* CUDA: not compiled in, or compiled in without a usable device here; either way it
     * does not open, and a build without it says so */
    CHECK_OK(mg_backend_probe_kind(MG_BACKEND_CUDA, &probe));
    if (!probe.usable) {
        mg_backend *b = (mg_backend *)&probe;
        mg_clear_error();
        CHECK(mg_backend_open(MG_BACKEND_CUDA, 0, &b) != MG_OK);
        CHECK(b == NULL);
        if (!probe.compiled_in) {
            CHECK(strstr(probe.reason, "not compiled in") != NULL);
            CHECK_MESSAGE("the cuda backend is not compiled in");
        }
        /* AUTO falls through to the CPU, which has no device 100 */
        CHECK_ERROR(mg_backend_open(MG_BACKEND_AUTO, 100, &b), MG_ERR_UNAVAILABLE,
                    "no usable backend has device 100");
        CHECK_OK(mg_backend_open(MG_BACKEND_AUTO, 6, &b));
        CHECK(mg_backend_get_kind(b) == MG_BACKEND_CPU);
        CHECK_OK(mg_backend_close(b));
    }
}

static void test_status_names(void) {
    static const char *const names[] = {
        "MG_OK",
        "MG_ERR_INVALID_ARGUMENT",
        "MG_ERR_OUT_OF_MEMORY",
        "MG_ERR_UNAVAILABLE",
        "MG_ERR_UNSUPPORTED",
        "MG_ERR_NOT_FOUND",
        "MG_ERR_NOT_READY",
        "MG_ERR_CAPTURING",
        "MG_ERR_BUSY",
        "MG_ERR_DEVICE",
        "MG_ERR_DEVICE_FAULT",
        "MG_ERR_INTERNAL",
    };
    for (int s = 0; s < (int)(sizeof names / sizeof names[0]); s++)
        CHECK(!strcmp(mg_status_name((mg_status)s), names[s]));
    CHECK(!strcmp(mg_status_name((mg_status)99), "MG_ERR_UNKNOWN"));
    static const char *const impls[] = {"auto", "fa2", "fa3"};
    for (int i = 0; i < 3; i++)
        CHECK(!strcmp(mg_attention_impl_name((mg_attention_impl)i), impls[i]));
    CHECK(!strcmp(mg_attention_impl_name((mg_attention_impl)9), "?"));
}

static void test_queries(mg_backend *b) {
    uint64_t free_bytes = 0, total_bytes = 0;
    CHECK_ERROR(mg_memory_free_bytes(b, NULL, NULL), MG_ERR_INVALID_ARGUMENT, "no output pointer");
    CHECK_OK(mg_memory_free_bytes(b, &free_bytes, NULL));
    CHECK_OK(mg_memory_free_bytes(b, NULL, &total_bytes));
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    CHECK(total_bytes == (uint64_t)pages * (uint64_t)page);
    CHECK(free_bytes > 0 && free_bytes <= total_bytes);
    CHECK_ERROR(mg_memory_device_free_bytes(b, NULL), MG_ERR_INVALID_ARGUMENT, "NULL output");
    uint64_t device_free = 0;
    CHECK_OK(mg_memory_device_free_bytes(b, &device_free));
    CHECK(device_free > 0 && device_free <= total_bytes);
    CHECK(mg_op_supported(b, MG_OP_ATTENTION_RAGGED));
    CHECK(mg_backend_supports(b, MG_CAP_MANAGED_MEMORY));
    CHECK(!mg_backend_supports(b, MG_CAP_MODULES));
    CHECK(!mg_backend_supports(b, MG_CAP_COUNT));

    /* a cap above what the host has left does not raise the free figure */
    CHECK_OK(mg_cpu_set_allocation_cap(b, UINT64_MAX / 2));
    uint64_t capped_free = 0, capped_total = 0;
    CHECK_OK(mg_memory_free_bytes(b, &capped_free, &capped_total));
    CHECK(capped_total == UINT64_MAX / 2 && capped_free <= total_bytes);
    CHECK_OK(mg_cpu_set_allocation_cap(b, 0));

    /* the test hooks refuse what is not an open CPU backend */
    mg_cpu_counters counters;
    CHECK_ERROR(mg_cpu_get_counters(b, NULL), MG_ERR_INVALID_ARGUMENT, "NULL output");
    CHECK_ERROR(mg_cpu_set_allocation_cap(NULL, 1), MG_ERR_INVALID_ARGUMENT,
                "mg_cpu_set_allocation_cap: NULL, invalid or closed backend handle");
    CHECK_ERROR(mg_cpu_fail_nth_allocation((mg_backend *)&counters, 1), MG_ERR_INVALID_ARGUMENT,
                "mg_cpu_fail_nth_allocation: invalid or closed backend handle");

    mg_devptr managed = 0;
    CHECK_OK(mg_alloc_managed(b, 100, &managed));
    CHECK_OK(mg_memset(b, managed, 9, 100));
    CHECK_OK(mg_free(b, managed));
}

/* The ledger's top sites and its printed report, against the allocations made here. */
static void test_ledger_report(mg_backend *b) {
    mg_devptr big[2], small = 0;
    for (int i = 0; i < 2; i++)
        CHECK_OK(mg_alloc(b, 1024, &big[i]));
    int big_line = __LINE__ - 1;
    CHECK_OK(mg_alloc(b, 512, &small));
    int small_line = __LINE__ - 1;

    size_t written = 7;
    mg_ledger_site sites[4];
    CHECK_ERROR(mg_ledger_top_sites(b, 0, NULL, 1, &written), MG_ERR_INVALID_ARGUMENT,
                "NULL output");
    CHECK_ERROR(mg_ledger_top_sites(b, 0, sites, 4, NULL), MG_ERR_INVALID_ARGUMENT, "NULL output");
    CHECK_OK(mg_ledger_top_sites(b, 0, NULL, 0, &written));
    CHECK(written == 0);
    CHECK_OK(mg_ledger_top_sites(b, 0, sites, 4, &written));
    CHECK(written == 2);
    CHECK(sites[0].line == big_line && sites[0].bytes == 2048 && sites[0].count == 2);
    CHECK(sites[1].line == small_line && sites[1].bytes == 512 && sites[1].count == 1);
    CHECK_OK(mg_ledger_top_sites(b, 600, sites, 4, &written)); /* the small site is filtered */
    CHECK(written == 1 && sites[0].line == big_line);

    CHECK_ERROR(mg_ledger_report(b, NULL, 4, 0), MG_ERR_INVALID_ARGUMENT, "NULL FILE");
    FILE *f = tmpfile();
    CHECK(f != NULL);
    if (f) {
        CHECK_OK(mg_ledger_report(b, f, 4, 0));
        rewind(f);
        char text[512] = "";
        size_t n = fread(text, 1, sizeof text - 1, f);
        text[n] = '\0';
        char want[128];
        CHECK(strstr(text, "ledger: 3 live allocations, 2.5 KiB\n") == text);
        snprintf(want, sizeof want,
                 "2.0 KiB in    2 allocations at test_api_argument_errors.c:%d\n", big_line);
        CHECK(strstr(text, want) != NULL);
        snprintf(want, sizeof want, "512 B in    1 allocations at test_api_argument_errors.c:%d\n",
                 small_line);
        CHECK(strstr(text, want) != NULL);
        fclose(f);
    }

    uint64_t freed_bytes = 0, freed_count = 0;
    CHECK_OK(mg_ledger_sweep(b, NULL, NULL)); /* the outputs are optional */
    CHECK_OK(mg_ledger_sweep(b, &freed_bytes, &freed_count));
    CHECK(freed_bytes == 0 && freed_count == 0); /* the first sweep took all three */
    CHECK_ERROR(mg_free(b, small), MG_ERR_INVALID_ARGUMENT, "not a live allocation");
}

static void test_stale_handles(mg_backend *b) {
    mg_stream *s = NULL;
    mg_event *e = NULL, *live_event = NULL;
    mg_graph *g = NULL;
    mg_devptr d = 0;
    CHECK_OK(mg_alloc(b, 64, &d));
    CHECK_OK(mg_stream_create(b, &s));
    CHECK_OK(mg_event_create(b, &e));
    CHECK_OK(mg_event_create(b, &live_event));
    CHECK_OK(mg_graph_begin_capture(s));
    CHECK_OK(mg_graph_end_capture(s, &g));
    CHECK_OK(mg_stream_destroy(s));
    CHECK_OK(mg_event_destroy(e));
    CHECK_OK(mg_graph_destroy(g));

    /* only the pointer values are compared against the handle registry */
    bool capturing = false;
    float ms = 0;
    CHECK_ERROR(mg_stream_destroy(s), MG_ERR_INVALID_ARGUMENT, "invalid or destroyed stream");
    CHECK_ERROR(mg_stream_synchronize(s), MG_ERR_INVALID_ARGUMENT, "invalid or destroyed");
    CHECK_ERROR(mg_stream_is_capturing(s, &capturing), MG_ERR_INVALID_ARGUMENT,
                "invalid or destroyed");
    CHECK_ERROR(mg_memset_async(b, d, 0, 8, s), MG_ERR_INVALID_ARGUMENT,
                "invalid or destroyed stream handle");
    CHECK_ERROR(mg_event_record(live_event, s), MG_ERR_INVALID_ARGUMENT, "invalid or destroyed");
    CHECK_ERROR(mg_event_record(e, NULL), MG_ERR_INVALID_ARGUMENT, "invalid or destroyed event");
    CHECK_ERROR(mg_stream_wait_event(mg_stream_default(b), e), MG_ERR_INVALID_ARGUMENT,
                "invalid or destroyed event");
    CHECK_ERROR(mg_event_synchronize(e), MG_ERR_INVALID_ARGUMENT, "invalid or destroyed event");
    CHECK_ERROR(mg_event_query(e), MG_ERR_INVALID_ARGUMENT, "invalid or destroyed event");
    CHECK_ERROR(mg_event_elapsed_ms(e, live_event, &ms), MG_ERR_INVALID_ARGUMENT,
                "invalid or destroyed event");
    CHECK_ERROR(mg_event_elapsed_ms(live_event, e, &ms), MG_ERR_INVALID_ARGUMENT,
                "invalid or destroyed event");
    CHECK_ERROR(mg_event_destroy(e), MG_ERR_INVALID_ARGUMENT, "invalid or destroyed event");
    CHECK_ERROR(mg_graph_begin_capture(s), MG_ERR_INVALID_ARGUMENT, "invalid or destroyed");
    CHECK_ERROR(mg_graph_end_capture(s, &g), MG_ERR_INVALID_ARGUMENT, "invalid stream");
    CHECK_ERROR(mg_graph_end_capture_update(s, g, NULL), MG_ERR_INVALID_ARGUMENT, "invalid stream");
    CHECK_ERROR(mg_graph_abort_capture(s), MG_ERR_INVALID_ARGUMENT, "invalid stream");
    CHECK_ERROR(mg_graph_launch(g, NULL), MG_ERR_INVALID_ARGUMENT, "invalid or destroyed graph");
    CHECK_ERROR(mg_graph_launch(NULL, NULL), MG_ERR_INVALID_ARGUMENT, "NULL graph handle");
    CHECK_ERROR(mg_graph_destroy(g), MG_ERR_INVALID_ARGUMENT, "invalid or destroyed graph");
    CHECK(mg_stream_default(NULL) == NULL);

    CHECK_OK(mg_event_destroy(live_event));
    CHECK_OK(mg_free(b, d));
}

static void test_null_outputs(mg_backend *b) {
    mg_stream *s = NULL;
    mg_event *e1 = NULL, *e2 = NULL;
    mg_graph *g = NULL;
    CHECK_ERROR(mg_stream_create(b, NULL), MG_ERR_INVALID_ARGUMENT,
                "mg_stream_create: NULL output");
    CHECK_ERROR(mg_event_create(b, NULL), MG_ERR_INVALID_ARGUMENT, "mg_event_create: NULL output");
    CHECK_OK(mg_stream_create(b, &s));
    CHECK_OK(mg_event_create(b, &e1));
    CHECK_OK(mg_event_create(b, &e2));
    CHECK_ERROR(mg_stream_is_capturing(s, NULL), MG_ERR_INVALID_ARGUMENT, "NULL output");
    CHECK_OK(mg_event_record(e1, s));
    CHECK_OK(mg_event_record(e2, s));
    CHECK_ERROR(mg_event_elapsed_ms(e1, e2, NULL), MG_ERR_INVALID_ARGUMENT, "NULL output");
    float ms = -1;
    CHECK_OK(mg_event_elapsed_ms(e1, e2, &ms));
    CHECK(ms >= 0.0f && ms < 1000.0f);

    CHECK_OK(mg_graph_begin_capture(s));
    CHECK_ERROR(mg_graph_end_capture(s, NULL), MG_ERR_INVALID_ARGUMENT, "NULL output");
    bool capturing = false;
    CHECK_OK(mg_stream_is_capturing(s, &capturing));
    CHECK(capturing); /* refused before the capture was touched */
    CHECK_OK(mg_graph_end_capture(s, &g));
    /* not capturing any more */
    CHECK_ERROR(mg_graph_end_capture(s, &g), MG_ERR_INVALID_ARGUMENT, "not capturing");
    CHECK(g == NULL);
    CHECK_OK(mg_graph_begin_capture(s));
    CHECK_OK(mg_graph_end_capture(s, &g));
    CHECK_ERROR(mg_graph_end_capture_update(s, g, NULL), MG_ERR_INVALID_ARGUMENT, "not capturing");
    CHECK_ERROR(mg_graph_abort_capture(s), MG_ERR_INVALID_ARGUMENT, "not capturing");
    /* updating without asking whether it was in place */
    CHECK_OK(mg_graph_begin_capture(s));
    CHECK_OK(mg_graph_end_capture_update(s, g, NULL));
    CHECK_OK(mg_graph_launch(g, s));

    void *host = (void *)1;
    mg_devptr mapped = 0;
    CHECK_ERROR(mg_host_alloc(b, 16, NULL), MG_ERR_INVALID_ARGUMENT, "NULL output");
    CHECK_ERROR(mg_host_device_pointer(b, NULL, &mapped), MG_ERR_INVALID_ARGUMENT,
                "NULL host pointer");
    CHECK_OK(mg_host_alloc(b, 16, &host));
    CHECK_ERROR(mg_host_device_pointer(b, host, NULL), MG_ERR_INVALID_ARGUMENT, "NULL output");
    CHECK_ERROR(mg_host_device_pointer(b, (char *)host + 1, &mapped), MG_ERR_INVALID_ARGUMENT,
                "not a live block from mg_host_alloc");
    CHECK_OK(mg_host_free(b, host));

    CHECK_OK(mg_graph_destroy(g));
    CHECK_OK(mg_event_destroy(e1));
    CHECK_OK(mg_event_destroy(e2));
    CHECK_OK(mg_stream_destroy(s));
}

/* Copies and memsets of 0 bytes validate their handles and do nothing. */
static void test_empty_transfers(mg_backend *b) {
    mg_devptr d = 0, e = 0;
    uint8_t host[16];
    memset(host, 0x11, sizeof host);
    CHECK_OK(mg_alloc(b, 16, &d));
    CHECK_OK(mg_alloc(b, 16, &e));
    CHECK_OK(mg_memset(b, d, 0xab, 16));
    mg_cpu_counters before = test_cpu_counters(b);
    CHECK_OK(mg_copy_h2d_async(b, d, host, 0, NULL));
    CHECK_OK(mg_copy_h2d_async_retained(b, d, host, 0, NULL));
    CHECK_OK(mg_copy_d2h_async(b, host, d, 0, NULL));
    CHECK_OK(mg_copy_d2d_async(b, e, d, 0, NULL));
    CHECK_OK(mg_copy_2d_d2d_async(b, e, 8, d, 8, 0, 2, NULL));
    CHECK_OK(mg_copy_2d_d2d_async(b, e, 8, d, 8, 8, 0, NULL));
    CHECK_OK(mg_memset_async(b, d, 0, 0, NULL));
    mg_cpu_counters after = test_cpu_counters(b);
    CHECK(after.copy_h2d_async == before.copy_h2d_async); /* never reached the backend */
    CHECK(after.copy_d2h_async == before.copy_d2h_async);
    CHECK(after.copy_2d == before.copy_2d && after.memset_async == before.memset_async);
    uint8_t out[16];
    CHECK_OK(mg_copy_d2h(b, out, d, 16));
    CHECK(out[0] == 0xab && out[15] == 0xab && host[0] == 0x11);

    CHECK_ERROR(mg_copy_2d_d2d_async(b, e, 8, d, 4, 8, 2, NULL), MG_ERR_INVALID_ARGUMENT,
                "src 4) must be >= the row width 8");
    CHECK_ERROR(mg_copy_2d_d2d_async(b, e, 8, d, 8, 8, SIZE_MAX, NULL), MG_ERR_INVALID_ARGUMENT,
                "overflow");
    CHECK_OK(mg_free(b, d));
    CHECK_OK(mg_free(b, e));
}

static void test_modules_and_names(mg_backend *b) {
    static const unsigned char image[4] = {1, 2, 3, 4};
    char long_name[300];
    memset(long_name, 'm', sizeof long_name - 1);
    long_name[sizeof long_name - 1] = '\0';
    mg_devptr p = 0;
    size_t bytes = 0;
    mg_kernel *k = NULL;

    CHECK_ERROR(mg_module_load(b, "model", "mod", image, sizeof image), MG_ERR_UNSUPPORTED,
                "the cpu backend cannot load modules");
    CHECK_ERROR(mg_module_load(b, long_name, "mod", image, sizeof image), MG_ERR_INVALID_ARGUMENT,
                "model name longer than");
    CHECK_ERROR(mg_module_load(b, "model", "mod", NULL, 4), MG_ERR_INVALID_ARGUMENT,
                "empty image for module 'mod'");
    CHECK_ERROR(mg_module_load(b, "model", "mod", image, 0), MG_ERR_INVALID_ARGUMENT,
                "empty image");
    CHECK_ERROR(mg_module_unload_model(b, "model"), MG_ERR_UNSUPPORTED, "cannot load modules");
    CHECK_ERROR(mg_module_unload_model(b, ""), MG_ERR_INVALID_ARGUMENT, "empty model name");
    CHECK_ERROR(mg_module_unload_model(NULL, "model"), MG_ERR_INVALID_ARGUMENT, "NULL backend");
    CHECK_ERROR(mg_module_symbol(b, "mod", "sym", &p, &bytes), MG_ERR_UNSUPPORTED,
                "no module symbols");
    CHECK_ERROR(mg_module_symbol(b, "mod", "sym", NULL, &bytes), MG_ERR_INVALID_ARGUMENT,
                "NULL output");
    CHECK_ERROR(mg_module_symbol(b, "mod", "sym", &p, NULL), MG_ERR_INVALID_ARGUMENT,
                "NULL output");
    CHECK_ERROR(mg_module_symbol(b, "mod", long_name, &p, &bytes), MG_ERR_INVALID_ARGUMENT,
                "symbol name longer than 255");
    CHECK_ERROR(mg_module_symbol(b, "", "sym", &p, &bytes), MG_ERR_INVALID_ARGUMENT,
                "empty module name");
    CHECK_ERROR(mg_module_symbol(NULL, "mod", "sym", &p, &bytes), MG_ERR_INVALID_ARGUMENT,
                "NULL backend");

    CHECK_ERROR(mg_kernel_lookup(b, "metrale", "vector_add", NULL), MG_ERR_INVALID_ARGUMENT,
                "NULL output");
    long_name[96] = '\0';
    CHECK_ERROR(mg_kernel_lookup(b, long_name, "vector_add", &k), MG_ERR_INVALID_ARGUMENT,
                "module name longer than 95");
    long_name[96] = 'm';
    long_name[128] = '\0';
    CHECK_ERROR(mg_kernel_lookup(b, "metrale", long_name, &k), MG_ERR_INVALID_ARGUMENT,
                "function name longer than 127");
    CHECK(k == NULL);
    CHECK(!strcmp(mg_kernel_name(NULL), ""));
    CHECK_ERROR(mg_kernel_release(NULL), MG_ERR_INVALID_ARGUMENT, "NULL kernel handle");
}

/* Every zero dimension of grid and block is refused, naming the dimensions. */
static void test_launch_dimensions(mg_backend *b) {
    mg_kernel *k = NULL;
    CHECK_OK(mg_kernel_lookup(b, "metrale", "empty_kernel", &k));
    CHECK_ERROR(mg_launch_run(b, k, NULL, NULL), MG_ERR_INVALID_ARGUMENT,
                "NULL launch builder for metrale:empty_kernel");
    for (int zero = 0; zero < 6; zero++) {
        uint32_t dims[6] = {2, 3, 4, 5, 6, 7};
        dims[zero] = 0;
        mg_launch l;
        mg_launch_init(&l, (mg_dim3){dims[0], dims[1], dims[2]},
                       (mg_dim3){dims[3], dims[4], dims[5]}, 0);
        char want[64];
        snprintf(want, sizeof want, "empty grid (%u,%u,%u) or block (%u,%u,%u)", dims[0], dims[1],
                 dims[2], dims[3], dims[4], dims[5]);
        CHECK_ERROR(mg_launch_run(b, k, NULL, &l), MG_ERR_INVALID_ARGUMENT, want);
    }
    mg_launch l;
    mg_launch_init(&l, (mg_dim3){1, 1, 1}, (mg_dim3){1, 1, 1}, 0);
    CHECK_OK(mg_launch_run(b, k, NULL, &l));
    CHECK_OK(mg_kernel_release(k));
    CHECK_ERROR(mg_kernel_release(k), MG_ERR_INVALID_ARGUMENT, "no outstanding lookup");
}

/* Closing abandons captures and releases every object still alive; afterwards the handles
 * are stale and the device can be opened again. */
static void test_close_with_live_objects(void) {
    mg_backend *b = NULL;
    CHECK_OK(mg_backend_open(MG_BACKEND_CPU, 6, &b));
    mg_stream *s = NULL, *capturing = NULL;
    mg_event *e = NULL;
    mg_graph *g = NULL;
    mg_kernel *k = NULL;
    void *host = NULL;
    mg_devptr d = 0;
    CHECK_OK(mg_alloc(b, 256, &d));
    CHECK_OK(mg_stream_create(b, &s));
    CHECK_OK(mg_stream_create(b, &capturing));
    CHECK_OK(mg_event_create(b, &e));
    CHECK_OK(mg_host_alloc(b, 64, &host));
    CHECK_OK(mg_kernel_lookup(b, "metrale", "empty_kernel", &k));
    CHECK_OK(mg_graph_begin_capture(s));
    CHECK_OK(mg_memset_async(b, d, 1, 256, s));
    CHECK_OK(mg_event_record(e, s));
    CHECK_OK(mg_graph_end_capture(s, &g));
    CHECK_OK(mg_graph_begin_capture(capturing));
    CHECK_OK(mg_memset_async(b, d, 2, 256, capturing));
    CHECK_OK(mg_graph_begin_capture(mg_stream_default(b)));
    CHECK_OK(mg_memset_async(b, d, 3, 256, NULL));

    CHECK_OK(mg_backend_close(b));
    CHECK_ERROR(mg_backend_close(b), MG_ERR_INVALID_ARGUMENT, "invalid or closed backend");
    CHECK_ERROR(mg_graph_destroy(g), MG_ERR_INVALID_ARGUMENT, "invalid or destroyed graph");
    CHECK_ERROR(mg_event_destroy(e), MG_ERR_INVALID_ARGUMENT, "invalid or destroyed event");
    CHECK_ERROR(mg_stream_destroy(s), MG_ERR_INVALID_ARGUMENT, "invalid or destroyed stream");
    CHECK_ERROR(mg_kernel_release(k), MG_ERR_INVALID_ARGUMENT, "invalid or forgotten");
    CHECK(!strcmp(mg_kernel_name(k), ""));
    uint64_t bytes = 0;
    CHECK_ERROR(mg_ledger_live(b, &bytes, NULL), MG_ERR_INVALID_ARGUMENT, "invalid backend");
    CHECK_ERROR(mg_ledger_top_sites(b, 0, NULL, 0, &(size_t){0}), MG_ERR_INVALID_ARGUMENT,
                "invalid backend");
    CHECK_ERROR(mg_ledger_report(b, stderr, 1, 0), MG_ERR_INVALID_ARGUMENT, "invalid backend");
    CHECK_ERROR(mg_ledger_sweep(b, NULL, NULL), MG_ERR_INVALID_ARGUMENT, "invalid backend");
    CHECK_ERROR(mg_host_free(b, host), MG_ERR_INVALID_ARGUMENT, "invalid backend");
    CHECK_ERROR(mg_memory_device_free_bytes(b, &bytes), MG_ERR_INVALID_ARGUMENT,
                "invalid or closed backend");
    CHECK_ERROR(mg_device_get_info(b, &(mg_device_info){0}), MG_ERR_INVALID_ARGUMENT,
                "invalid or closed backend");
    CHECK_OK(mg_backend_open(MG_BACKEND_CPU, 6, &b));
    CHECK_OK(mg_ledger_live(b, &bytes, NULL));
    CHECK(bytes == 0);
    CHECK_OK(mg_backend_close(b));
}

int main(void) {
    test_kinds_and_probes();
    test_status_names();
    mg_backend *b = NULL;
    CHECK_OK(mg_backend_open(MG_BACKEND_CPU, 3, &b));
    if (!b)
        return test_finish();
    test_queries(b);
    test_ledger_report(b);
    test_stale_handles(b);
    test_null_outputs(b);
    test_empty_transfers(b);
    test_modules_and_names(b);
    test_launch_dimensions(b);
    CHECK_OK(mg_backend_close(b));
    test_close_with_live_objects();
    return test_finish();
}
