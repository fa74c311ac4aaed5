/* cpu_kernels.c - the process-wide registry of CPU kernels, lookup and launch, and the
 * built-in kernels of module "metrale". */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_backend.h"
#include "cpu_kernels.h"
#include "error.h"

/* Entries live for the whole process (handles into them are memoised by every backend's op
 * cache); registering a name again replaces only its function. */
struct mg_cpu_kernel {
    mg_cpu_kernel *next;
    char *module, *function;
    char *full_name;     /* "module:function" */
    mg_cpu_kernel_fn fn; /* read and written under registry_lock */
};

static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static mg_cpu_kernel *registry;
static pthread_once_t builtins_once = PTHREAD_ONCE_INIT;

/* The backend whose launch is running on this thread: buffer arguments resolve against it. */
static _Thread_local mg_cpu_backend *tls_launching_backend;

/* Caller holds registry_lock. */
static mg_cpu_kernel *registry_find(const char *module, const char *function) {
    for (mg_cpu_kernel *k = registry; k; k = k->next)
        if (strcmp(k->module, module) == 0 && strcmp(k->function, function) == 0)
            return k;
    return NULL;
}

static mg_status registry_put(const char *module, const char *function, mg_cpu_kernel_fn fn) {
    pthread_mutex_lock(&registry_lock);
    mg_cpu_kernel *k = registry_find(module, function);
    if (k) {
        k->fn = fn;
        pthread_mutex_unlock(&registry_lock);
        return MG_OK;
    }
    size_t full_bytes = strlen(module) + strlen(function) + 2;
    k = calloc(1, sizeof *k);
    if (k) {
        k->module = strdup(module);
        k->function = strdup(function);
        k->full_name = malloc(full_bytes);
    }
    if (!k || !k->module || !k->function || !k->full_name) {
        pthread_mutex_unlock(&registry_lock);
        if (k) {
            free(k->module);
            free(k->function);
            free(k->full_name);
            free(k);
        }
        return MG_ERROR(MG_ERR_OUT_OF_MEMORY,
                        "mg_cpu_kernel_register: out of host memory for %s:%s", module, function);
    }
    snprintf(k->full_name, full_bytes, "%s:%s", module, function);
    k->fn = fn;
    k->next = registry;
    registry = k;
    pthread_mutex_unlock(&registry_lock);
    return MG_OK;
}

mg_status mg_cpu_kernel_register(const char *module, const char *function, mg_cpu_kernel_fn fn) {
    if (!module || !*module || !function || !*function || !fn)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "mg_cpu_kernel_register: %s",
                        !module || !*module       ? "NULL or empty module name"
                        : !function || !*function ? "NULL or empty function name"
                                                  : "NULL kernel function");
    /* Built-ins first, so a caller's registration of a built-in name is not overwritten by a
     * later first-use initialisation. */
    mg_cpu_kernels_init();
    return registry_put(module, function, fn);
}

const char *mg_cpu_kernel_full_name(const mg_cpu_kernel *k) {
    return k->full_name;
}

/* ------------------------------------------------------------------ kernel helpers */

static const char *arg_kind_name(mg_arg_kind kind) {
    switch (kind) {
    case MG_ARG_BUFFER:
        return "buffer";
    case MG_ARG_U32:
        return "u32";
    case MG_ARG_I32:
        return "i32";
    case MG_ARG_U64:
        return "u64";
    case MG_ARG_F32:
        return "f32";
    case MG_ARG_BYTES:
        return "bytes";
    case MG_ARG_TENSOR_MAP:
        return "tensor_map";
    }
    return "?";
}

mg_status mg_cpu_kernel_check_args(const mg_launch *l, const char *kernel, const mg_arg_kind *kinds,
                                   uint32_t count) {
    if (l->arg_count != count)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "cpu kernel %s: takes %u arguments, launched with %u", kernel, count,
                        l->arg_count);
    for (uint32_t i = 0; i < count; i++)
        if (l->args[i].kind != kinds[i])
            return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                            "cpu kernel %s: argument %u must be %s, launched with %s", kernel, i,
                            arg_kind_name(kinds[i]), arg_kind_name(l->args[i].kind));
    return MG_OK;
}

mg_status mg_cpu_kernel_buffer(const mg_launch *l, uint32_t index, uint64_t bytes,
                               uint32_t alignment, const char *kernel, void **host_out) {
    if (!tls_launching_backend)
        return MG_ERROR(MG_ERR_INTERNAL,
                        "cpu kernel %s: mg_cpu_kernel_buffer called outside a CPU launch", kernel);
    if (index >= l->arg_count || l->args[index].kind != MG_ARG_BUFFER)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "cpu kernel %s: argument %u is not a buffer",
                        kernel, index);
    mg_devptr ptr = mg_launch_get_ptr(l, index);
    if (alignment > 1 && ptr % alignment != 0)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "cpu kernel %s: argument %u (0x%" PRIx64 ") is misaligned: needs %u-byte "
                        "alignment",
                        kernel, index, ptr, alignment);
    char what[32];
    snprintf(what, sizeof what, "argument %u", index);
    return mg_cpu_resolve(tls_launching_backend, ptr, bytes, kernel, what, host_out);
}

/* ------------------------------------------------------------------ built-in kernels */

/* out[i] = a[i] + b[i] for i < n (floats); any grid covers n, as the CUDA kernel's
 * grid-stride loop does. */
static mg_status kernel_vector_add(const mg_launch *l) {
    static const char name[] = "metrale:vector_add";
    static const mg_arg_kind kinds[] = {MG_ARG_BUFFER, MG_ARG_BUFFER, MG_ARG_BUFFER, MG_ARG_U32};
    mg_status st = mg_cpu_kernel_check_args(l, name, kinds, 4);
    if (st)
        return st;
    uint32_t n = mg_launch_get_u32(l, 3);
    uint64_t bytes = (uint64_t)n * sizeof(float);
    void *a, *b, *out;
    if ((st = mg_cpu_kernel_buffer(l, 0, bytes, sizeof(float), name, &a)) ||
        (st = mg_cpu_kernel_buffer(l, 1, bytes, sizeof(float), name, &b)) ||
        (st = mg_cpu_kernel_buffer(l, 2, bytes, sizeof(float), name, &out)))
        return st;
    const float *fa = a, *fb = b;
    float *fo = out;
    for (uint32_t i = 0; i < n; i++)
        fo[i] = fa[i] + fb[i];
    return MG_OK;
}

/* Does nothing: launch-latency benchmarks time the launch path. */
static mg_status kernel_empty(const mg_launch *l) {
    return mg_cpu_kernel_check_args(l, "metrale:empty_kernel", NULL, 0);
}

static void register_builtins(void) {
    /* Failure here is out of host memory at start-up; lookups then report NOT_FOUND. */
    registry_put("metrale", "vector_add", kernel_vector_add);
    registry_put("metrale", "empty_kernel", kernel_empty);
}

void mg_cpu_kernels_init(void) {
    pthread_once(&builtins_once, register_builtins);
}

/* ------------------------------------------------------------------ backend ops */

mg_status mg_cpu_kernel_lookup(void *ctx, const char *module, const char *function, void **out) {
    mg_cpu_backend *c = ctx;
    mg_cpu_count(c, MG_CPU_COUNT_kernel_lookup);
    mg_cpu_kernels_init();
    pthread_mutex_lock(&registry_lock);
    mg_cpu_kernel *k = registry_find(module, function);
    pthread_mutex_unlock(&registry_lock);
    if (!k)
        return MG_ERROR(MG_ERR_NOT_FOUND,
                        "cpu kernel_lookup: no kernel \"%s\" in module \"%s\" (CPU kernels are "
                        "registered with mg_cpu_kernel_register)",
                        function, module);
    *out = k;
    return MG_OK;
}

mg_status mg_cpu_launch(void *ctx, void *kernel, const char *kernel_name, void *stream,
                        const mg_launch *launch) {
    mg_cpu_backend *c = ctx;
    mg_cpu_count(c, MG_CPU_COUNT_launch);
    const char *name = kernel_name ? kernel_name : mg_cpu_kernel_full_name(kernel);
    if (launch->error)
        return MG_ERROR(launch->error, "cpu launch of %s: the launch builder failed (%s)", name,
                        mg_status_name(launch->error));
    const mg_dim3 g = launch->grid, b = launch->block;
    if (!g.x || !g.y || !g.z || !b.x || !b.y || !b.z)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "cpu launch of %s: empty grid (%u,%u,%u) or block (%u,%u,%u)", name, g.x,
                        g.y, g.z, b.x, b.y, b.z);
    if (launch->shared_bytes > MG_CPU_MAX_SHARED_PER_BLOCK)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "cpu launch of %s: %u bytes of dynamic shared memory, more than the "
                        "%u a block may use",
                        name, launch->shared_bytes, MG_CPU_MAX_SHARED_PER_BLOCK);
    return mg_cpu_stream_launch(c, stream, kernel, launch);
}

mg_status mg_cpu_kernel_execute(mg_cpu_backend *c, mg_cpu_kernel *k, const mg_launch *launch) {
    pthread_mutex_lock(&registry_lock);
    mg_cpu_kernel_fn fn = k->fn;
    pthread_mutex_unlock(&registry_lock);
    mg_cpu_backend *outer = tls_launching_backend; /* a kernel may launch through the API */
    tls_launching_backend = c;
    mg_status st = fn(launch);
    tls_launching_backend = outer;
    return st;
}
