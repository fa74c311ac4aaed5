/*
 * test_sticky_fault.c - the core's sticky-fault rule (metrale/gpu.h): after a device fault
 * every call on the backend fails fast with MG_ERR_DEVICE_FAULT and the original message,
 * while the free paths (memory, host blocks, streams, events, graphs, kernels, arenas, ending
 * a capture) still succeed and closing releases everything. The CPU backend never faults by
 * itself, so the fault is recorded through the backend interface (private "backend_impl.h"),
 * the way the CUDA backend records one.
 */
#include "backend_impl.h"
#include "metrale/arena.h"
#include "metrale/gpu.h"
#include "metrale/launch.h"
#include "metrale/ops_attention.h"
#include "metrale/ops_gemm.h"
#include "metrale/timing.h"
#include "test_util.h"

#define FAULT_TEXT "injected: an illegal memory access was encountered"

#define CHECK_FAULTED(expr)                                                                        \
    do {                                                                                           \
        mg_clear_error();                                                                          \
        CHECK_STATUS(expr, MG_ERR_DEVICE_FAULT);                                                   \
        CHECK_MESSAGE(FAULT_TEXT " (sticky device fault: the cpu backend is unusable until "       \
                                 "closed)");                                                       \
    } while (0)

int main(void) {
    mg_backend *b = NULL, *healthy = NULL;
    CHECK_OK(mg_backend_open(MG_BACKEND_CPU, 2, &b));
    CHECK_OK(mg_backend_open(MG_BACKEND_CPU, 3, &healthy));
    if (!b || !healthy)
        return test_finish();

    /* what exists when the fault happens */
    mg_devptr d = 0, healthy_d = 0;
    mg_stream *s = NULL, *capturing = NULL;
    mg_event *e = NULL;
    mg_graph *g = NULL, *captured = NULL;
    mg_kernel *k = NULL;
    void *host = NULL;
    mg_arena_plan *plan = NULL;
    mg_arena *arena = NULL;
    CHECK_OK(mg_alloc(b, 4096, &d));
    CHECK_OK(mg_alloc(healthy, 64, &healthy_d));
    CHECK_OK(mg_stream_create(b, &s));
    CHECK_OK(mg_stream_create(b, &capturing));
    CHECK_OK(mg_event_create(b, &e));
    CHECK_OK(mg_host_alloc(b, 128, &host));
    CHECK_OK(mg_kernel_lookup(b, "metrale", "empty_kernel", &k));
    CHECK_OK(mg_graph_begin_capture(s));
    CHECK_OK(mg_memset_async(b, d, 1, 64, s));
    CHECK_OK(mg_graph_end_capture(s, &g));
    CHECK_OK(mg_arena_plan_create(&plan));
    CHECK_OK(mg_arena_plan_add(plan, "x", 1000, 0, NULL, NULL));
    CHECK_OK(mg_arena_create(b, plan, &arena));
    mg_timing *t = NULL;
    CHECK_OK(mg_timing_create(b, NULL, &t));
    CHECK_OK(mg_graph_begin_capture(capturing));

    CHECK_OK(mg_backend_check_fault(b));
    mg_backend_set_fault(b, FAULT_TEXT);
    mg_backend_set_fault(b, "a later fault does not replace the first");

    uint8_t buf[64] = {0};
    uint64_t u = 0;
    bool flag = false;
    float ms = 0;
    mg_stream *new_stream = NULL;
    mg_event *new_event = NULL;
    mg_kernel *new_kernel = NULL;
    void *new_host = NULL;
    mg_devptr p = 0;
    size_t bytes = 0;
    mg_device_info info;
    mg_launch l;
    mg_launch_init(&l, (mg_dim3){1, 1, 1}, (mg_dim3){1, 1, 1}, 0);

    CHECK_FAULTED(mg_backend_check_fault(b));
    CHECK_FAULTED(mg_device_get_info(b, &info));
    CHECK_FAULTED(mg_memory_free_bytes(b, &u, NULL));
    CHECK_FAULTED(mg_memory_device_free_bytes(b, &u));
    CHECK_FAULTED(mg_alloc(b, 64, &p));
    CHECK(p == 0);
    CHECK_FAULTED(mg_copy_h2d(b, d, buf, sizeof buf));
    CHECK_FAULTED(mg_copy_d2h(b, buf, d, sizeof buf));
    CHECK_FAULTED(mg_copy_d2d(b, d + 64, d, 64));
    CHECK_FAULTED(mg_copy_h2d_async(b, d, buf, sizeof buf, s));
    CHECK_FAULTED(mg_copy_d2h_async(b, buf, d, sizeof buf, NULL));
    CHECK_FAULTED(mg_copy_2d_d2d_async(b, d + 64, 16, d, 16, 16, 2, s));
    CHECK_FAULTED(mg_memset(b, d, 0, 64));
    CHECK_FAULTED(mg_memset_async(b, d, 0, 64, s));
    CHECK_FAULTED(mg_stream_create(b, &new_stream));
    CHECK_FAULTED(mg_stream_synchronize(s));
    CHECK_FAULTED(mg_stream_is_capturing(s, &flag));
    CHECK_FAULTED(mg_event_create(b, &new_event));
    CHECK_FAULTED(mg_event_record(e, s));
    CHECK_FAULTED(mg_stream_wait_event(s, e));
    CHECK_FAULTED(mg_event_synchronize(e));
    CHECK_FAULTED(mg_event_query(e));
    CHECK_FAULTED(mg_event_elapsed_ms(e, e, &ms));
    CHECK_FAULTED(mg_graph_begin_capture(s));
    CHECK_FAULTED(mg_graph_launch(g, s));
    CHECK_FAULTED(mg_host_alloc(b, 64, &new_host));
    CHECK_FAULTED(mg_host_device_pointer(b, host, &p));
    CHECK_FAULTED(mg_kernel_lookup(b, "metrale", "vector_add", &new_kernel));
    CHECK_FAULTED(mg_launch_run(b, k, s, &l));
    CHECK_FAULTED(mg_module_symbol(b, "m", "s", &p, &bytes));
    CHECK_FAULTED(mg_gemm_bf16(b, s, 16, 16, 16, d, d + 1024, d + 2048, MG_DTYPE_F32, 16));
    mg_attention_desc desc = {
        .num_qo_heads = 1, .num_kv_heads = 1, .head_dim = 8, .window_left = -1, .sm_scale = 1.0f};
    int32_t indptr[2] = {0, 1};
    mg_attention_plan *attention = NULL;
    CHECK_FAULTED(mg_attention_plan_create(b, &desc, indptr, indptr, 1, NULL, &attention));
    CHECK(new_stream == NULL && new_event == NULL && new_kernel == NULL && new_host == NULL);

    /* timing never records into a faulted backend: begin reports the fault */
    uint32_t lane = 0;
    mg_timing_span span = 0;
    CHECK_OK(mg_timing_lane(t, "decode", &lane));
    CHECK_FAULTED(mg_timing_lane_begin(t, lane, s, &span));
    CHECK(span == 0);

    /* other backends are unaffected */
    CHECK_OK(mg_memset(healthy, healthy_d, 5, 64));
    CHECK_OK(mg_free(healthy, healthy_d));

    /* what still works: ending the capture begun before the fault, and every release */
    mg_clear_error();
    CHECK_OK(mg_graph_end_capture(capturing, &captured));
    CHECK(captured != NULL);
    CHECK_OK(mg_graph_destroy(captured));
    CHECK_OK(mg_timing_destroy(t));
    CHECK_OK(mg_arena_destroy(arena));
    mg_arena_plan_destroy(plan);
    CHECK_OK(mg_kernel_release(k));
    CHECK_OK(mg_graph_destroy(g));
    CHECK_OK(mg_event_destroy(e));
    CHECK_OK(mg_stream_destroy(s));
    CHECK_OK(mg_stream_destroy(capturing));
    CHECK_OK(mg_host_free(b, host));
    CHECK_OK(mg_free(b, d));
    uint64_t live_bytes = 1, live_count = 1;
    CHECK_OK(mg_ledger_live(b, &live_bytes, &live_count));
    CHECK(live_bytes == 0 && live_count == 0);
    CHECK_OK(mg_backend_close(b));

    /* the device opens again, healthy */
    CHECK_OK(mg_backend_open(MG_BACKEND_CPU, 2, &b));
    CHECK_OK(mg_backend_check_fault(b));
    CHECK_OK(mg_alloc(b, 64, &p));
    CHECK_OK(mg_backend_close(b));
    CHECK_OK(mg_backend_close(healthy));
    return test_finish();
}
