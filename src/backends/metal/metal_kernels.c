/* metal_kernels.c - the library compiled from the embedded MSL (kernels/metal/), pipelines
 * per function, and launches: buffers bound with setBuffer:offset:atIndex: and scalars with
 * setBytes:length:atIndex:, argument i of the launch builder at index i. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "metal_internal.h"

/* Metal's limits on one compute encoder's argument table. */
#define MAX_BUFFER_INDEX 31
#define MAX_SET_BYTES 4096

struct mg_metal_kernel {
    mg_metal_kernel *next;
    char *full_name; /* "module:function" */
    const char *function;
    mg_id pipeline; /* id<MTLComputePipelineState>, owned */
    mg_nsuint max_threads;
};

const char *mg_metal_kernel_full_name(const mg_metal_kernel *k) {
    return k->full_name;
}

/* Compiles the embedded source once per backend. Caller holds library_lock. */
static mg_status ensure_library(mg_metal_backend *c) {
    if (c->library)
        return MG_OK;
    const mg_metal_runtime *rt = c->rt;
    void *pool = mg_metal_pool_push(rt);
    mg_id source = mg_metal_string(rt, mg_metal_kernel_source);
    mg_id error = NULL;
    mg_id lib = source ? MG_MSG(rt, mg_id, (mg_id, mg_sel, mg_id, mg_id, mg_id *))(
                             c->dev, rt->sel.newLibraryWithSource, source, NULL, &error)
                       : NULL;
    char why[1024] = "out of memory for the source string";
    if (!lib && source)
        mg_metal_describe_error(rt, error, why, sizeof why);
    mg_metal_release(rt, source);
    mg_metal_pool_pop(rt, pool);
    if (!lib)
        return MG_ERROR(MG_ERR_INTERNAL,
                        "metal kernel_lookup: the built-in kernels do not compile on this device: "
                        "%s",
                        why);
    c->library = lib;
    return MG_OK;
}

static mg_status make_kernel(mg_metal_backend *c, const char *module, const char *function,
                             mg_metal_kernel **out) {
    const mg_metal_runtime *rt = c->rt;
    mg_status st = ensure_library(c);
    if (st)
        return st;
    void *pool = mg_metal_pool_push(rt);
    mg_id name = mg_metal_string(rt, function);
    mg_id fn = name ? MG_MSG(rt, mg_id, (mg_id, mg_sel, mg_id))(c->library,
                                                                rt->sel.newFunctionWithName, name)
                    : NULL;
    mg_metal_release(rt, name);
    mg_id error = NULL, pipeline = NULL;
    char why[512] = "";
    if (fn) {
        pipeline = MG_MSG(rt, mg_id, (mg_id, mg_sel, mg_id, mg_id *))(
            c->dev, rt->sel.newComputePipelineState, fn, &error);
        if (!pipeline)
            mg_metal_describe_error(rt, error, why, sizeof why);
        mg_metal_release(rt, fn);
    }
    mg_metal_pool_pop(rt, pool);
    if (!fn)
        return MG_ERROR(MG_ERR_NOT_FOUND,
                        "metal kernel_lookup: no kernel \"%s\" in module \"%s\" (the Metal "
                        "kernels are kernels/metal/*.metal)",
                        function, module);
    if (!pipeline)
        return MG_ERROR(MG_ERR_INTERNAL, "metal kernel_lookup: no pipeline for %s:%s: %s", module,
                        function, why);
    mg_metal_kernel *k = calloc(1, sizeof *k);
    size_t full_bytes = strlen(module) + strlen(function) + 2;
    char *full = malloc(full_bytes);
    if (!k || !full) {
        free(k);
        free(full);
        mg_metal_release(rt, pipeline);
        return MG_ERROR(MG_ERR_OUT_OF_MEMORY, "metal kernel_lookup: out of host memory");
    }
    snprintf(full, full_bytes, "%s:%s", module, function);
    k->full_name = full;
    k->function = full + strlen(module) + 1;
    k->pipeline = pipeline;
    k->max_threads =
        MG_MSG(rt, mg_nsuint, (mg_id, mg_sel))(pipeline, rt->sel.maxTotalThreadsPerThreadgroup);
    *out = k;
    return MG_OK;
}

mg_status mg_metal_kernel_lookup(void *ctx, const char *module, const char *function, void **out) {
    mg_metal_backend *c = ctx;
    if (strcmp(module, "metrale") != 0)
        return MG_ERROR(MG_ERR_NOT_FOUND,
                        "metal kernel_lookup: no kernel \"%s\" in module \"%s\" (the Metal "
                        "backend ships module \"metrale\" only)",
                        function, module);
    pthread_mutex_lock(&c->library_lock);
    mg_metal_kernel *k = c->kernels;
    while (k && strcmp(k->function, function) != 0)
        k = k->next;
    mg_status st = MG_OK;
    if (!k && !(st = make_kernel(c, module, function, &k))) {
        k->next = c->kernels;
        c->kernels = k;
    }
    pthread_mutex_unlock(&c->library_lock);
    if (!st)
        *out = k;
    return st;
}

mg_status mg_metal_launch(void *ctx, void *kernel, const char *kernel_name, void *stream,
                          const mg_launch *launch) {
    mg_metal_backend *c = ctx;
    mg_metal_kernel *k = kernel;
    const char *name = kernel_name ? kernel_name : k->full_name;
    if (launch->error)
        return MG_ERROR(launch->error, "metal launch of %s: the launch builder failed (%s)", name,
                        mg_status_name(launch->error));
    const mg_dim3 g = launch->grid, b = launch->block;
    if (!g.x || !g.y || !g.z || !b.x || !b.y || !b.z)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "metal launch of %s: empty grid (%u,%u,%u) or block (%u,%u,%u)", name, g.x,
                        g.y, g.z, b.x, b.y, b.z);
    uint64_t threads = (uint64_t)b.x * b.y * b.z;
    if (threads > k->max_threads)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "metal launch of %s: %" PRIu64 " threads per threadgroup, more than the "
                        "pipeline's %lu",
                        name, threads, (unsigned long)k->max_threads);
    if (launch->shared_bytes > c->max_threadgroup_memory)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "metal launch of %s: %u bytes of threadgroup memory, more than the %u a "
                        "threadgroup may use",
                        name, launch->shared_bytes, c->max_threadgroup_memory);
    if (launch->arg_count > MAX_BUFFER_INDEX)
        return MG_ERROR(MG_ERR_UNSUPPORTED,
                        "metal launch of %s: %u arguments, more than Metal's %d buffer indices",
                        name, launch->arg_count, MAX_BUFFER_INDEX);
    for (uint32_t i = 0; i < launch->arg_count; i++) {
        const mg_launch_arg *a = &launch->args[i];
        if (a->kind == MG_ARG_TENSOR_MAP)
            return MG_ERROR(MG_ERR_UNSUPPORTED,
                            "metal launch of %s: argument %u is a CUDA tensor map", name, i);
        if (a->kind != MG_ARG_BUFFER && a->bytes > MAX_SET_BYTES)
            return MG_ERROR(MG_ERR_UNSUPPORTED,
                            "metal launch of %s: argument %u has %u bytes, more than "
                            "setBytes:length:atIndex: takes (%d)",
                            name, i, a->bytes, MAX_SET_BYTES);
    }
    return mg_metal_stream_launch(c, stream, k, launch);
}

mg_status mg_metal_encode_launch(mg_metal_backend *c, mg_id encoder, const mg_metal_kernel *k,
                                 const mg_launch *l) {
    const mg_metal_runtime *rt = c->rt;
    /* Resolve every buffer first, so a failure encodes nothing. */
    mg_id buffers[MAX_BUFFER_INDEX] = {0};
    uint64_t offsets[MAX_BUFFER_INDEX] = {0};
    char what[32];
    for (uint32_t i = 0; i < l->arg_count; i++) {
        mg_devptr p = l->args[i].kind == MG_ARG_BUFFER ? mg_launch_get_ptr(l, i) : 0;
        if (!p)
            continue; /* scalars; a null buffer binds nil (an optional tensor) */
        snprintf(what, sizeof what, "argument %u", i);
        /* The kernel's extent is its own business: the start must lie in a live buffer. */
        mg_status st = mg_metal_resolve(c, p, 0, k->full_name, what, &buffers[i], &offsets[i]);
        if (st)
            return st;
    }
    MG_MSG(rt, void, (mg_id, mg_sel, mg_id))(encoder, rt->sel.setComputePipelineState, k->pipeline);
    for (uint32_t i = 0; i < l->arg_count; i++) {
        const mg_launch_arg *a = &l->args[i];
        if (a->kind == MG_ARG_BUFFER)
            MG_MSG(rt, void, (mg_id, mg_sel, mg_id, mg_nsuint, mg_nsuint))
        (encoder, rt->sel.setBuffer, buffers[i], offsets[i], i);
        else if (a->bytes) /* an empty byte argument keeps its index and binds nothing */
            MG_MSG(rt, void, (mg_id, mg_sel, const void *, mg_nsuint, mg_nsuint))(
                encoder, rt->sel.setBytes, mg_launch_arg_data(l, i), a->bytes, i);
    }
    if (l->shared_bytes) /* Metal wants a multiple of 16 bytes */
        MG_MSG(rt, void, (mg_id, mg_sel, mg_nsuint, mg_nsuint))
    (encoder, rt->sel.setThreadgroupMemoryLength, (l->shared_bytes + 15u) & ~15u, 0);
    MG_MSG(rt, void, (mg_id, mg_sel, mg_mtl_size, mg_mtl_size))
    (encoder, rt->sel.dispatchThreadgroups, (mg_mtl_size){l->grid.x, l->grid.y, l->grid.z},
     (mg_mtl_size){l->block.x, l->block.y, l->block.z});
    return MG_OK;
}

void mg_metal_release_kernels(mg_metal_backend *c) {
    while (c->kernels) {
        mg_metal_kernel *k = c->kernels;
        c->kernels = k->next;
        mg_metal_release(c->rt, k->pipeline);
        free(k->full_name);
        free(k);
    }
    mg_metal_release(c->rt, c->library);
    c->library = NULL;
}
