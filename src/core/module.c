/*
 * module.c - modules, kernels and launches of metrale/gpu.h and metrale/launch.h: module
 * loading per model, memoised kernel lookups (the op cache), and mg_launch_run with its
 * optional kernel timing and debug synchronisation.
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend_internal.h"
#include "error.h"
#include "metrale/timing.h"
#include "op_cache.h"

/* ------------------------------------------------------------------ modules and kernels */

static mg_status check_name(const char *name, size_t max_bytes, const char *fn, const char *what) {
    if (!name || !*name)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: empty %s name", fn, what);
    if (strlen(name) >= max_bytes)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: %s name longer than %zu bytes", fn, what,
                        max_bytes - 1);
    return MG_OK;
}

mg_status mg_module_load(mg_backend *b, const char *model, const char *name, const void *image,
                         size_t bytes) {
    const char *fn = "mg_module_load";
    mg_status st = mg_core_enter(b, fn);
    if (!st)
        st = check_name(model, sizeof b->modules[0].model, fn, "model");
    if (!st)
        st = check_name(name, sizeof b->modules[0].name, fn, "module");
    if (st)
        return st;
    if (!image || bytes == 0)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: empty image for module '%s'", fn, name);
    if (!b->ops->module_load || !b->ops->supports(b->ctx, MG_CAP_MODULES))
        return MG_ERROR(MG_ERR_UNSUPPORTED, "%s: the %s backend cannot load modules", fn,
                        mg_backend_kind_name(b->kind));
    if (!strcmp(name, "metrale"))
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: module name 'metrale' is reserved", fn);
    pthread_mutex_lock(&b->lock);
    for (size_t i = 0; i < b->module_count; i++)
        if (!strcmp(b->modules[i].name, name)) {
            pthread_mutex_unlock(&b->lock);
            return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                            "%s: a module named '%s' is already loaded (model '%s')", fn, name,
                            b->modules[i].model);
        }
    if (b->module_count == b->module_capacity) {
        size_t cap = b->module_capacity ? b->module_capacity * 2 : 8;
        mg_module_record *grown = realloc(b->modules, cap * sizeof *grown);
        if (!grown) {
            pthread_mutex_unlock(&b->lock);
            return MG_ERROR(MG_ERR_OUT_OF_MEMORY, "%s: module table", fn);
        }
        b->modules = grown;
        b->module_capacity = cap;
    }
    /* Loading under the lock keeps the name check and the insert one step. */
    st = b->ops->module_load(b->ctx, model, name, image, bytes);
    if (st == MG_OK) {
        mg_module_record *r = &b->modules[b->module_count++];
        snprintf(r->model, sizeof r->model, "%s", model);
        snprintf(r->name, sizeof r->name, "%s", name);
    }
    pthread_mutex_unlock(&b->lock);
    return st;
}

mg_status mg_module_unload_model(mg_backend *b, const char *model) {
    const char *fn = "mg_module_unload_model";
    mg_status st = mg_core_enter(b, fn);
    if (!st)
        st = check_name(model, sizeof b->modules[0].model, fn, "model");
    if (st)
        return st;
    if (!b->ops->module_unload_model)
        return MG_ERROR(MG_ERR_UNSUPPORTED, "%s: the %s backend cannot load modules", fn,
                        mg_backend_kind_name(b->kind));
    pthread_mutex_lock(&b->lock);
    const char **names = calloc(b->module_count ? b->module_count : 1, sizeof *names);
    size_t n = 0;
    if (!names) {
        pthread_mutex_unlock(&b->lock);
        return MG_ERROR(MG_ERR_OUT_OF_MEMORY, "%s: name list", fn);
    }
    for (size_t i = 0; i < b->module_count; i++)
        if (!strcmp(b->modules[i].model, model))
            names[n++] = b->modules[i].name;
    if (n == 0)
        st = MG_ERROR(MG_ERR_NOT_FOUND, "%s: no module of model '%s' is loaded", fn, model);
    if (!st)
        st = mg_op_cache_forget_modules(b->op_cache, names, n);
    if (!st)
        st = b->ops->module_unload_model(b->ctx, model);
    if (!st) {
        size_t kept = 0;
        for (size_t i = 0; i < b->module_count; i++)
            if (strcmp(b->modules[i].model, model))
                b->modules[kept++] = b->modules[i];
        b->module_count = kept;
    }
    pthread_mutex_unlock(&b->lock);
    free(names);
    return st;
}

mg_status mg_module_symbol(mg_backend *b, const char *module, const char *symbol, mg_devptr *ptr,
                           size_t *bytes) {
    const char *fn = "mg_module_symbol";
    mg_status st = mg_core_enter(b, fn);
    if (!st)
        st = check_name(module, 96, fn, "module");
    if (!st)
        st = check_name(symbol, 256, fn, "symbol");
    if (st)
        return st;
    if (!ptr || !bytes)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: NULL output", fn);
    if (!b->ops->module_symbol)
        return MG_ERROR(MG_ERR_UNSUPPORTED, "%s: the %s backend has no module symbols", fn,
                        mg_backend_kind_name(b->kind));
    return b->ops->module_symbol(b->ctx, module, symbol, ptr, bytes);
}

mg_status mg_kernel_lookup(mg_backend *b, const char *module, const char *function,
                           mg_kernel **out) {
    const char *fn = "mg_kernel_lookup";
    mg_status st = mg_core_enter(b, fn);
    if (!st)
        st = check_name(module, 96, fn, "module");
    if (!st)
        st = check_name(function, 128, fn, "function");
    if (st)
        return st;
    if (!out)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: NULL output", fn);
    *out = NULL;
    return mg_op_cache_kernel(b->op_cache, module, function, true, out);
}

mg_status mg_kernel_release(mg_kernel *k) {
    if (!mg_handle_is(k, MG_HANDLE_KERNEL))
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "mg_kernel_release: %s kernel handle %p",
                        k ? "invalid or forgotten" : "NULL", (void *)k);
    uint_fast64_t holds = atomic_load(&k->holds);
    do {
        if (holds == 0)
            return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                            "mg_kernel_release: %s has no outstanding lookup to release", k->name);
    } while (!atomic_compare_exchange_weak(&k->holds, &holds, holds - 1));
    return MG_OK;
}

const char *mg_kernel_name(const mg_kernel *k) {
    return mg_handle_is(k, MG_HANDLE_KERNEL) ? k->name : "";
}

static bool debug_sync_enabled(void) {
    static atomic_int cached = -1; /* -1 unknown, else 0/1; racing first calls agree */
    int v = atomic_load(&cached);
    if (v < 0) {
        const char *env = getenv("METRALE_DEBUG_SYNC_KERNELS");
        v = env && !strcmp(env, "1");
        atomic_store(&cached, v);
    }
    return v == 1;
}

/* The checks of a launch: live handles of one backend, a valid builder, a non-empty grid. */
static mg_status check_launch(mg_backend *b, mg_kernel *k, mg_stream *s, const mg_launch *launch,
                              const char *fn, mg_stream **rs_out) {
    mg_stream *rs = NULL;
    mg_status st = mg_core_enter(b, fn);
    if (!st)
        st = mg_core_resolve_stream(b, s, fn, &rs);
    if (st)
        return st;
    if (!mg_handle_is(k, MG_HANDLE_KERNEL) || k->owner != b)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: kernel %p is invalid or of another backend",
                        fn, (void *)k);
    if (!launch)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "%s: NULL launch builder for %s", fn, k->name);
    if (launch->error)
        return MG_ERROR(launch->error, "%s: the argument list of %s is invalid: %s", fn, k->name,
                        launch->error_message);
    if (!launch->grid.x || !launch->grid.y || !launch->grid.z || !launch->block.x ||
        !launch->block.y || !launch->block.z)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "%s: %s has an empty grid (%u,%u,%u) or block (%u,%u,%u)", fn, k->name,
                        launch->grid.x, launch->grid.y, launch->grid.z, launch->block.x,
                        launch->block.y, launch->block.z);
    *rs_out = rs;
    return MG_OK;
}

mg_status mg_launch_run_repeated(mg_backend *b, mg_kernel *k, mg_stream *s, const mg_launch *launch,
                                 uint32_t count) {
    mg_stream *rs = NULL;
    mg_status st = check_launch(b, k, s, launch, "mg_launch_run_repeated", &rs);
    for (uint32_t i = 0; !st && i < count; i++)
        if ((st = b->ops->launch(b->ctx, k->impl, k->name, rs->impl, launch)))
            mg_error_append(" (launch %u of %u)", i + 1, count);
    return st;
}

mg_status mg_launch_run(mg_backend *b, mg_kernel *k, mg_stream *s, const mg_launch *launch) {
    mg_stream *rs = NULL;
    mg_status st = check_launch(b, k, s, launch, "mg_launch_run", &rs);
    if (st)
        return st;
    mg_timing *timing = atomic_load(&b->launch_timing);
    mg_timing_span span = 0;
    if (timing)
        mg_timing_kernel_begin(timing, k->name, rs,
                               &span); /* a timing failure never fails a launch */
    st = b->ops->launch(b->ctx, k->impl, k->name, rs->impl, launch);
    if (span)
        mg_timing_span_end(timing, span, rs);
    if (st == MG_OK && debug_sync_enabled() && !atomic_load(&rs->capturing)) {
        st = b->ops->stream_synchronize(b->ctx, rs->impl);
        if (st) {
            char desc[512];
            mg_launch_describe(launch, k->name, desc, sizeof desc);
            mg_error_append(" [METRALE_DEBUG_SYNC_KERNELS: failed in %s]", desc);
        }
    }
    return st;
}

mg_status mg_backend_attach_launch_timing(mg_backend *b, mg_timing *t) {
    mg_status live = mg_backend_check_live(b, "mg_timing_trace_launches");
    if (live)
        return live;
    mg_timing *expected = NULL;
    if (!atomic_compare_exchange_strong(&b->launch_timing, &expected, t) && expected != t)
        return MG_ERROR(MG_ERR_BUSY,
                        "mg_timing_trace_launches: another timing object already traces this "
                        "backend's launches");
    return MG_OK;
}

void mg_backend_detach_launch_timing(mg_backend *b, mg_timing *t) {
    if (!mg_handle_is(b, MG_HANDLE_BACKEND))
        return;
    mg_timing *expected = t;
    atomic_compare_exchange_strong(&b->launch_timing, &expected, NULL);
}
