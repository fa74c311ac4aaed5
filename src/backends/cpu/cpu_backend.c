/* cpu_backend.c - the CPU backend's driver entry (probe, open), its queries and its ops
 * table. The reference every other backend is checked against: see cpu_backend.h. */
#include "cpu_backend.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <unistd.h>
#if defined(__GLIBC__)
#include <gnu/libc-version.h>
#endif

#include "error.h"
#include "host_memory.h"

uint64_t mg_cpu_physical_bytes(void) {
    long pages = sysconf(_SC_PHYS_PAGES), page_bytes = sysconf(_SC_PAGESIZE);
    if (pages <= 0 || page_bytes <= 0)
        return 0;
    return (uint64_t)pages * (uint64_t)page_bytes;
}

static int host_threads(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

static void cpu_destroy(void *ctx) {
    mg_cpu_backend *c = ctx;
    mg_cpu_release_all_objects(c);
    mg_cpu_release_all_ranges(c);
    mg_ledger_destroy(&c->device_ranges);
    mg_ledger_destroy(&c->host_ranges);
    mg_ledger_destroy(&c->registered_ranges);
    pthread_mutex_destroy(&c->lock);
    free(c);
}

static mg_status cpu_device_info(void *ctx, mg_device_info *out) {
    mg_cpu_backend *c = ctx;
    mg_cpu_count(c, MG_CPU_COUNT_device_info);
    struct utsname host;
    const char *machine = uname(&host) == 0 ? host.machine : "unknown";
    memset(out, 0, sizeof *out);
    snprintf(out->name, sizeof out->name, "CPU (%s, %d threads)", machine, host_threads());
    out->total_bytes = mg_cpu_physical_bytes();
    out->multiprocessors = host_threads();
    out->cc_major = out->cc_minor = 0;
    out->integrated = true;
#ifdef _SC_LEVEL2_CACHE_SIZE
    long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
    out->l2_bytes = l2 > 0 ? (uint64_t)l2 : 0;
#endif
    out->max_shared_per_block_optin = MG_CPU_MAX_SHARED_PER_BLOCK;
#if defined(__GLIBC__)
    snprintf(out->driver, sizeof out->driver, "metrale cpu %d, glibc %s", c->device,
             gnu_get_libc_version());
#else
    snprintf(out->driver, sizeof out->driver, "metrale cpu %d", c->device);
#endif
    return MG_OK;
}

static mg_status cpu_memory_info(void *ctx, uint64_t *free_bytes, uint64_t *total_bytes,
                                 uint64_t *device_free_bytes) {
    mg_cpu_backend *c = ctx;
    mg_cpu_count(c, MG_CPU_COUNT_memory_info);
    uint64_t total = mg_cpu_physical_bytes();
    uint64_t available = mg_host_available_bytes();
    pthread_mutex_lock(&c->lock);
    if (c->allocation_cap_bytes) {
        uint64_t headroom = c->allocation_cap_bytes > c->live_device_bytes
                                ? c->allocation_cap_bytes - c->live_device_bytes
                                : 0;
        total = c->allocation_cap_bytes;
        if (headroom < available)
            available = headroom;
    }
    pthread_mutex_unlock(&c->lock);
    if (available > total)
        available = total;
    if (free_bytes)
        *free_bytes = available;
    if (total_bytes)
        *total_bytes = total;
    if (device_free_bytes)
        *device_free_bytes = available;
    return MG_OK;
}

static bool cpu_supports(void *ctx, mg_capability cap) {
    (void)ctx;
    switch (cap) {
    case MG_CAP_MANAGED_MEMORY: /* the same host memory as device allocations */
    case MG_CAP_GRAPHS:
    case MG_CAP_GRAPH_UPDATE:
    case MG_CAP_HOST_DEVICE_POINTER:
    case MG_CAP_EVENT_TIMING:
        return true;
    case MG_CAP_PINNED_HOST: /* heap memory: nothing is page-locked */
    case MG_CAP_MODULES:     /* kernels are C functions, registered by name */
    default:
        return false;
    }
}

static const mg_backend_ops cpu_ops = {
    .version = MG_BACKEND_OPS_VERSION,
    .kind = MG_BACKEND_CPU,
    .pointers_checked_strictly = true,
    .destroy = cpu_destroy,
    .device_info = cpu_device_info,
    .memory_info = cpu_memory_info,
    .supports = cpu_supports,
    .alloc = mg_cpu_alloc,
    .free = mg_cpu_free,
    .copy_h2d = mg_cpu_copy_h2d,
    .copy_d2h = mg_cpu_copy_d2h,
    .copy_d2d = mg_cpu_copy_d2d,
    .copy_h2d_async = mg_cpu_copy_h2d_async,
    .copy_d2h_async = mg_cpu_copy_d2h_async,
    .copy_d2d_async = mg_cpu_copy_d2d_async,
    .copy_2d_d2d_async = mg_cpu_copy_2d_d2d_async,
    .memset = mg_cpu_memset,
    .memset_async = mg_cpu_memset_async,
    .stream_create = mg_cpu_stream_create,
    .stream_destroy = mg_cpu_stream_destroy,
    .stream_synchronize = mg_cpu_stream_synchronize,
    .stream_is_capturing = mg_cpu_stream_is_capturing,
    .event_create = mg_cpu_event_create,
    .event_record = mg_cpu_event_record,
    .stream_wait_event = mg_cpu_stream_wait_event,
    .event_synchronize = mg_cpu_event_synchronize,
    .event_query = mg_cpu_event_query,
    .event_elapsed_ms = mg_cpu_event_elapsed_ms,
    .event_destroy = mg_cpu_event_destroy,
    .graph_begin_capture = mg_cpu_graph_begin_capture,
    .graph_end_capture = mg_cpu_graph_end_capture,
    .graph_end_capture_update = mg_cpu_graph_end_capture_update,
    .graph_abort_capture = mg_cpu_graph_abort_capture,
    .graph_launch = mg_cpu_graph_launch,
    .graph_destroy = mg_cpu_graph_destroy,
    .graph_count_nodes = mg_cpu_graph_count_nodes,
    .host_alloc = mg_cpu_host_alloc,
    .host_free = mg_cpu_host_free,
    .host_device_pointer = mg_cpu_host_device_pointer,
    .host_register = mg_cpu_host_register,
    .host_unregister = mg_cpu_host_unregister,
    .host_registered = mg_cpu_host_registered,
    .module_load = NULL, /* MG_CAP_MODULES is false */
    .module_unload_model = NULL,
    .module_symbol = NULL,
    .kernel_lookup = mg_cpu_kernel_lookup,
    .launch = mg_cpu_launch,
};

static void cpu_probe(mg_backend_probe *out) {
    memset(out, 0, sizeof *out);
    out->compiled_in = true;
    out->usable = true;
    out->device_count = MG_CPU_DEVICE_COUNT;
}

static mg_status cpu_open(int device, const mg_backend_ops **ops_out, void **ctx_out) {
    if (device < 0 || device >= MG_CPU_DEVICE_COUNT)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "cpu backend: device %d out of range (0..%d)",
                        device, MG_CPU_DEVICE_COUNT - 1);
    mg_cpu_backend *c = calloc(1, sizeof *c);
    if (!c)
        return MG_ERROR(MG_ERR_OUT_OF_MEMORY, "cpu backend: out of host memory opening device %d",
                        device);
    c->device = device;
    mg_ledger_init(&c->device_ranges);
    mg_ledger_init(&c->host_ranges);
    mg_ledger_init(&c->registered_ranges);
    pthread_mutex_init(&c->lock, NULL);
    for (int i = 0; i < MG_CPU_COUNTER_COUNT; i++)
        atomic_init(&c->counters[i], 0);
    mg_cpu_kernels_init();
    *ops_out = &cpu_ops;
    *ctx_out = c;
    return MG_OK;
}

const mg_backend_driver mg_cpu_backend_driver = {
    .kind = MG_BACKEND_CPU,
    .probe = cpu_probe,
    .open = cpu_open,
};
