/*
 * metrale/cpu.h - test hooks of the CPU backend: call counters and injected out-of-memory.
 *
 * The CPU backend (MG_BACKEND_CPU) keeps device memory in host memory and really executes
 * every call, so it is the reference other backends are checked against. Tests use these
 * hooks to prove that a layer above made exactly the backend calls it should (e.g. that a
 * memoised kernel lookup reached the backend once) and that its out-of-memory paths release
 * what they took.
 *
 * Every function takes a public mg_backend; a NULL or non-CPU backend is
 * MG_ERR_INVALID_ARGUMENT. All are thread-safe.
 */
#ifndef METRALE_CPU_H
#define METRALE_CPU_H

#include <stdint.h>

#include "metrale/export.h"
#include "metrale/gpu.h"

#ifdef __cplusplus
extern "C" {
#endif

/* How many times each backend method was called since the backend was opened, counting
 * calls that failed. Work recorded into a capture counts when it is recorded, not when a
 * graph replays it; graph_begin_capture counts captures begun, graph_capture captures ended
 * (end_capture and end_capture_update), graph_abort_capture captures aborted; event_wait
 * counts mg_stream_wait_event; event_elapsed mg_event_elapsed_ms; stream_is_capturing,
 * host_device_pointer, device_info and memory_info the queries that reached the backend
 * (device_info and memory_info include those the core makes itself, e.g. at open);
 * kernel_lookup counts lookups that reached the backend (the core memoises, so normally once
 * per name). */
typedef struct mg_cpu_counters {
    uint64_t alloc, free, copy_h2d, copy_d2h, copy_d2d, copy_h2d_async, copy_d2h_async,
        copy_d2d_async, copy_2d, memset, memset_async, stream_create, stream_destroy,
        stream_synchronize, event_create, event_record, event_wait, event_synchronize, event_query,
        event_destroy, graph_capture, graph_launch, graph_destroy, host_alloc, host_free,
        kernel_lookup, launch, graph_begin_capture, graph_abort_capture, stream_is_capturing,
        event_elapsed, host_device_pointer, device_info, memory_info;
} mg_cpu_counters;

MG_API mg_status mg_cpu_get_counters(mg_backend *b, mg_cpu_counters *out);

/* Limits live device bytes (device, managed and arena allocations, each rounded up to 256
 * bytes): an allocation that would take them above `cap_bytes` fails with
 * MG_ERR_OUT_OF_MEMORY and a message naming the request and the cap. 0 removes the cap.
 * While a cap is set, mg_memory_free_bytes reports the cap as the total. */
MG_API mg_status mg_cpu_set_allocation_cap(mg_backend *b, uint64_t cap_bytes);

/* The n-th device allocation from now (1 = the next one) fails with MG_ERR_OUT_OF_MEMORY;
 * later ones succeed again. 0 disables a pending failure. */
MG_API mg_status mg_cpu_fail_nth_allocation(mg_backend *b, uint64_t n);

#ifdef __cplusplus
}
#endif
#endif
