/* cpu_counters.c - the CPU backend's test hooks (metrale/cpu.h). */
#include "cpu/cpu_backend.h"
#include "error.h"

_Static_assert(sizeof(mg_cpu_counters) == MG_CPU_COUNTER_COUNT * sizeof(uint64_t),
               "MG_CPU_COUNTERS must list every field of mg_cpu_counters");

mg_status mg_cpu_from_backend(mg_backend *b, const char *call, mg_cpu_backend **out) {
    if (!b)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: NULL backend", call);
    if (!mg_backend_context(b))
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: invalid or closed backend handle %p", call,
                        (void *)b);
    if (mg_backend_get_kind(b) != MG_BACKEND_CPU)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: the backend is %s, not cpu", call,
                        mg_backend_kind_name(mg_backend_get_kind(b)));
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

mg_status mg_cpu_set_allocation_cap(mg_backend *b, uint64_t cap_bytes) {
    mg_cpu_backend *c;
    mg_status st = mg_cpu_from_backend(b, "mg_cpu_set_allocation_cap", &c);
    if (st)
        return st;
    pthread_mutex_lock(&c->lock);
    c->allocation_cap_bytes = cap_bytes;
    pthread_mutex_unlock(&c->lock);
    return MG_OK;
}

mg_status mg_cpu_fail_nth_allocation(mg_backend *b, uint64_t n) {
    mg_cpu_backend *c;
    mg_status st = mg_cpu_from_backend(b, "mg_cpu_fail_nth_allocation", &c);
    if (st)
        return st;
    pthread_mutex_lock(&c->lock);
    c->fail_countdown = n;
    pthread_mutex_unlock(&c->lock);
    return MG_OK;
}
