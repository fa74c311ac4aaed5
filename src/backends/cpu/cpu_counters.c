/* cpu_counters.c - the CPU backend's test hooks (metrale/cpu.h). */
#include "cpu_backend.h"
#include "error.h"

#include <stddef.h>

_Static_assert(sizeof(mg_cpu_counters) == MG_CPU_COUNTER_COUNT * sizeof(uint64_t),
               "MG_CPU_COUNTERS must list every field of mg_cpu_counters");

mg_status mg_cpu_from_backend(mg_backend *b, const char *call, mg_cpu_backend **out) {
    /* NULL or any other dead handle: the core's one message (mg_backend_check_live). */
    mg_status st = mg_backend_check_live(b, call);
    if (st)
        return st;
    mg_backend_kind kind = mg_backend_live_kind(b);
    if (kind != MG_BACKEND_CPU)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: the backend is %s, not cpu", call,
                        mg_backend_kind_name(kind));
    *out = mg_backend_context(b);
    return MG_OK;
}

mg_status mg_cpu_get_counters(mg_backend *b, mg_cpu_counters *out) {
    mg_cpu_backend *c;
    mg_status st = mg_cpu_from_backend(b, "mg_cpu_get_counters", &c);
    if (st)
        return st;
    if (!out)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "mg_cpu_get_counters: NULL output");
#define MG_CPU_COUNTER_READ(name) out->name = atomic_load(&c->counters[MG_CPU_COUNT_##name]);
    MG_CPU_COUNTERS(MG_CPU_COUNTER_READ)
#undef MG_CPU_COUNTER_READ
    return MG_OK;
}

_Static_assert(_Generic(((mg_cpu_backend *)0)->allocation_cap_bytes, uint64_t : 1, default : 0) &&
                   _Generic(((mg_cpu_backend *)0)->fail_countdown, uint64_t : 1, default : 0),
               "store_test_hook writes the test-hook fields as uint64_t");

/* Stores `value` in the uint64_t test-hook field at `field_offset` of the CPU backend, under
 * its lock, so the allocator sees either the old or the new setting. */
static mg_status store_test_hook(mg_backend *b, const char *call, size_t field_offset,
                                 uint64_t value) {
    mg_cpu_backend *c = NULL;
    mg_status st = mg_cpu_from_backend(b, call, &c);
    if (st)
        return st;
    pthread_mutex_lock(&c->lock);
    *(uint64_t *)((char *)c + field_offset) = value;
    pthread_mutex_unlock(&c->lock);
    return MG_OK;
}

mg_status mg_cpu_set_allocation_cap(mg_backend *b, uint64_t cap_bytes) {
    return store_test_hook(b, "mg_cpu_set_allocation_cap",
                           offsetof(mg_cpu_backend, allocation_cap_bytes), cap_bytes);
}

mg_status mg_cpu_fail_nth_allocation(mg_backend *b, uint64_t n) {
    return store_test_hook(b, "mg_cpu_fail_nth_allocation",
                           offsetof(mg_cpu_backend, fail_countdown), n);
}
