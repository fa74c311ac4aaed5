/*
 * cuda_module.c - the module registry (modules grouped by model, loaded from PTX, cubin or
 * fatbin), kernel lookup and kernel launch.
 *
 * The kernels compiled into the library (src/backends/cuda/embedded_kernels.h) are loaded at open
 * as module "metrale", which may span several images and cannot be unloaded. Kernel objects live
 * until the backend is destroyed, so a fault report can always name the kernel launched last; once
 * their module is unloaded they refuse to launch.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_internal.h"
#include "embedded_kernels.h"
#include "metrale/switches.h"

#define BUILTIN_MODULE "metrale"
#define DEFAULT_SHARED_LIMIT_BYTES (48u << 10)

/* ------------------------------------------------------------------ image formats */

static bool is_ptx_text(const unsigned char *p, size_t bytes) {
    size_t n = 0;
    while (n < bytes && p[n] != 0) {
        unsigned char ch = p[n];
        if (ch >= 0x80 || (ch < 0x20 && ch != '\n' && ch != '\r' && ch != '\t'))
            return false;
        n++;
    }
    /* Anything after a NUL must be NUL padding. */
    for (size_t i = n; i < bytes; i++)
        if (p[i] != 0)
            return false;
    static const char *const directives[] = {".version", ".target"};
    for (size_t d = 0; d < 2; d++) {
        size_t len = strlen(directives[d]);
        for (size_t i = 0; i + len <= n; i++)
            if (memcmp(p + i, directives[d], len) == 0)
                return true;
    }
    return false;
}

mg_cuda_image_format mg_cuda_image_detect(const void *image, size_t bytes) {
    const unsigned char *p = image;
    if (!p || bytes == 0)
        return MG_CUDA_IMAGE_UNKNOWN;
    if (bytes >= 4 && p[0] == 0x50 && p[1] == 0xED && p[2] == 0x55 && p[3] == 0xBA)
        return MG_CUDA_IMAGE_FATBIN;
    if (bytes >= 4 && p[0] == 0x7F && p[1] == 'E' && p[2] == 'L' && p[3] == 'F')
        return MG_CUDA_IMAGE_CUBIN;
    if (is_ptx_text(p, bytes))
        return MG_CUDA_IMAGE_PTX;
    return MG_CUDA_IMAGE_UNKNOWN;
}

const char *mg_cuda_image_format_name(mg_cuda_image_format f) {
    switch (f) {
    case MG_CUDA_IMAGE_PTX:
        return "PTX";
    case MG_CUDA_IMAGE_CUBIN:
        return "cubin";
    case MG_CUDA_IMAGE_FATBIN:
        return "fatbin";
    default:
        return "unknown";
    }
}

/* ------------------------------------------------------------------ loading */

/* Loads one image; the JIT's error log (PTX) goes into the message. */
static mg_status load_image(mg_cuda_context *c, const char *name, const void *image, size_t bytes,
                            CUmodule *out) {
    mg_cuda_image_format format = mg_cuda_image_detect(image, bytes);
    if (format == MG_CUDA_IMAGE_UNKNOWN) {
        const unsigned char *p = image;
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "mg_module_load(%s): %zu bytes that are neither PTX text, a cubin (ELF) "
                        "nor a fatbin; first bytes %02x %02x %02x %02x",
                        name, bytes, bytes > 0 ? p[0] : 0, bytes > 1 ? p[1] : 0,
                        bytes > 2 ? p[2] : 0, bytes > 3 ? p[3] : 0);
    }
    char *terminated = NULL;
    if (format == MG_CUDA_IMAGE_PTX && ((const char *)image)[bytes - 1] != '\0') {
        /* The driver reads PTX as a C string. */
        terminated = malloc(bytes + 1);
        if (!terminated)
            return MG_ERROR(MG_ERR_OUT_OF_MEMORY, "mg_module_load(%s): %zu-byte PTX copy", name,
                            bytes);
        memcpy(terminated, image, bytes);
        terminated[bytes] = '\0';
        image = terminated;
    }
    char log[1024] = "";
    CUjit_option options[] = {CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
    void *values[] = {log, (void *)(uintptr_t)sizeof log};
    CUresult r = c->drv->ModuleLoadDataEx(out, image, 2, options, values);
    free(terminated);
    if (r != CUDA_SUCCESS) {
        *out = NULL;
        log[sizeof log - 1] = '\0';
        return MG_CUDA_FAIL(c, r, "cuModuleLoadDataEx",
                            "module %s (%s, %zu bytes) on %s (sm_%d%d)%s%s", name,
                            mg_cuda_image_format_name(format), bytes, c->info.name,
                            c->info.cc_major, c->info.cc_minor, log[0] ? ": " : "", log);
    }
    return MG_OK;
}

/* Appends a registry entry for a loaded module. Module lock held. */
static mg_status add_module(mg_cuda_context *c, const char *model, const char *name,
                            CUmodule module) {
    mg_cuda_module *m = calloc(1, sizeof *m);
    if (!m)
        return MG_ERROR(MG_ERR_OUT_OF_MEMORY, "module registry entry");
    snprintf(m->model, sizeof m->model, "%s", model);
    snprintf(m->name, sizeof m->name, "%s", name);
    m->module = module;
    mg_cuda_module **tail = &c->modules;
    while (*tail)
        tail = &(*tail)->next;
    *tail = m;
    return MG_OK;
}

mg_status mg_cuda_modules_load_builtin(mg_cuda_context *c) {
    for (const mg_embedded_kernel_image *e = mg_embedded_kernel_images; e->name; e++) {
        CUmodule module;
        mg_status st = load_image(c, e->name, e->image, *e->bytes, &module);
        if (st) {
            mg_error_append(" (built-in kernels of %s.cu; this library supports sm_80 and "
                            "newer)",
                            e->name);
            return st;
        }
        pthread_mutex_lock(&c->module_lock);
        st = add_module(c, "", BUILTIN_MODULE, module);
        pthread_mutex_unlock(&c->module_lock);
        if (st) {
            (void)c->drv->ModuleUnload(module);
            return st;
        }
    }
    return MG_OK;
}

void mg_cuda_modules_destroy(mg_cuda_context *c) {
    pthread_mutex_lock(&c->module_lock);
    for (mg_cuda_module *m = c->modules, *next; m; m = next) {
        next = m->next;
        (void)c->drv->ModuleUnload(m->module);
        free(m);
    }
    c->modules = NULL;
    for (mg_cuda_kernel *k = c->kernels, *next; k; k = next) {
        next = k->next;
        pthread_mutex_destroy(&k->shared_limit_lock);
        free(k);
    }
    c->kernels = NULL;
    atomic_store(&c->last_kernel, NULL);
    pthread_mutex_unlock(&c->module_lock);
}

mg_status mg_cuda_module_load(void *ctx, const char *model, const char *name, const void *image,
                              size_t bytes) {
    mg_cuda_context *c = ctx;
    mg_status st = mg_cuda_enter(c);
    if (st)
        return st;
    pthread_mutex_lock(&c->module_lock);
    CUmodule module;
    st = load_image(c, name, image, bytes, &module);
    if (st == MG_OK && (st = add_module(c, model, name, module)))
        (void)c->drv->ModuleUnload(module);
    pthread_mutex_unlock(&c->module_lock);
    return st;
}

mg_status mg_cuda_module_unload_model(void *ctx, const char *model) {
    mg_cuda_context *c = ctx;
    mg_status st = mg_cuda_make_current(c);
    if (st)
        return st;
    pthread_mutex_lock(&c->module_lock);
    size_t unloaded = 0;
    CUresult first_error = CUDA_SUCCESS;
    for (mg_cuda_module **link = &c->modules; *link;) {
        mg_cuda_module *m = *link;
        if (strcmp(m->model, model) != 0) {
            link = &m->next;
            continue;
        }
        for (mg_cuda_kernel *k = c->kernels; k; k = k->next)
            if (k->module == m->module)
                atomic_store(&k->unloaded, true);
        CUresult r = c->drv->ModuleUnload(m->module);
        if (r != CUDA_SUCCESS && !mg_cuda_result_is_teardown(r) && first_error == CUDA_SUCCESS)
            first_error = r;
        *link = m->next;
        free(m);
        unloaded++;
    }
    pthread_mutex_unlock(&c->module_lock);
    if (unloaded == 0)
        return MG_ERROR(MG_ERR_NOT_FOUND,
                        "mg_module_unload_model: no module of model \"%s\" "
                        "is loaded",
                        model);
    if (first_error != CUDA_SUCCESS && !c->faulted)
        return MG_CUDA_FAIL(c, first_error, "cuModuleUnload", "model \"%s\"", model);
    return MG_OK;
}

/* One per-module lookup of find_in_modules: cuModuleGetGlobal or cuModuleGetFunction. */
typedef struct module_lookup {
    CUdeviceptr global;
    size_t global_bytes;
    CUfunction function;
} module_lookup;

static CUresult get_global(mg_cuda_context *c, CUmodule m, const char *name, module_lookup *out) {
    return c->drv->ModuleGetGlobal(&out->global, &out->global_bytes, m, name);
}

static CUresult get_function(mg_cuda_context *c, CUmodule m, const char *name, module_lookup *out) {
    return c->drv->ModuleGetFunction(&out->function, m, name);
}

/* Enters the context and asks each loaded module called `module` for the `what` named `name`
 * with `get` (the driver call `driver_call`) until one has it. On MG_OK, `*from` is that module
 * and module_lock is held: the caller unlocks. Otherwise the lock is released and the status
 * says whether the module or the name was missing, or what the driver reported. */
static mg_status
find_in_modules(mg_cuda_context *c, const char *call, const char *module, const char *what,
                const char *name,
                CUresult (*get)(mg_cuda_context *, CUmodule, const char *, module_lookup *),
                const char *driver_call, module_lookup *out, mg_cuda_module **from) {
    mg_status st = mg_cuda_enter(c);
    if (st)
        return st;
    bool module_found = false;
    CUresult r = CUDA_ERROR_NOT_FOUND;
    pthread_mutex_lock(&c->module_lock);
    for (mg_cuda_module *m = c->modules; m && r == CUDA_ERROR_NOT_FOUND; m = m->next) {
        if (strcmp(m->name, module) != 0)
            continue;
        module_found = true;
        r = get(c, m->module, name, out);
        *from = m;
    }
    if (r == CUDA_SUCCESS)
        return MG_OK;
    pthread_mutex_unlock(&c->module_lock);
    if (!module_found)
        return MG_ERROR(MG_ERR_NOT_FOUND, "%s: no module named \"%s\"", call, module);
    if (r == CUDA_ERROR_NOT_FOUND)
        return MG_ERROR(MG_ERR_NOT_FOUND, "%s: module \"%s\" has no %s \"%s\"", call, module, what,
                        name);
    return MG_CUDA_FAIL(c, r, driver_call, "%s \"%s\" in module \"%s\"", what, name, module);
}

mg_status mg_cuda_module_symbol(void *ctx, const char *module, const char *symbol, mg_devptr *ptr,
                                size_t *bytes) {
    mg_cuda_context *c = ctx;
    mg_cuda_module *from = NULL;
    module_lookup found = {0};
    mg_status st = find_in_modules(c, "mg_module_symbol", module, "global", symbol, get_global,
                                   "cuModuleGetGlobal", &found, &from);
    if (st)
        return st;
    pthread_mutex_unlock(&c->module_lock);
    if (ptr)
        *ptr = (mg_devptr)found.global;
    if (bytes)
        *bytes = found.global_bytes;
    return MG_OK;
}

mg_status mg_cuda_kernel_lookup(void *ctx, const char *module, const char *function, void **out) {
    mg_cuda_context *c = ctx;
    mg_cuda_module *from = NULL;
    module_lookup found = {0};
    mg_status st = find_in_modules(c, "mg_kernel_lookup", module, "kernel", function, get_function,
                                   "cuModuleGetFunction", &found, &from);
    if (st)
        return st;
    mg_cuda_kernel *k = calloc(1, sizeof *k);
    if (!k) {
        pthread_mutex_unlock(&c->module_lock);
        return MG_ERROR(MG_ERR_OUT_OF_MEMORY, "kernel object for %s:%s", module, function);
    }
    k->function = found.function;
    k->module = from->module;
    atomic_init(&k->shared_limit_bytes, DEFAULT_SHARED_LIMIT_BYTES);
    pthread_mutex_init(&k->shared_limit_lock, NULL);
    atomic_init(&k->unloaded, false);
    snprintf(k->name, sizeof k->name, "%s:%s", module, function);
    k->next = c->kernels;
    c->kernels = k;
    pthread_mutex_unlock(&c->module_lock);
    *out = k;
    return MG_OK;
}

/* ------------------------------------------------------------------ launch */

/* Raises the function's dynamic shared memory limit when a launch needs more than it has.
 * Concurrent launches raise it under the kernel's lock and only upward, and the stored limit
 * follows the driver attribute: a launch that passes the fast check never sees a limit the
 * function does not have, and a smaller concurrent raise never lowers a larger one. */
static mg_status ensure_shared_limit(mg_cuda_context *c, mg_cuda_kernel *k, const char *name,
                                     uint32_t shared_bytes) {
    if (shared_bytes <= atomic_load_explicit(&k->shared_limit_bytes, memory_order_acquire))
        return MG_OK;
    if (shared_bytes > c->info.max_shared_per_block_optin)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "launch of %s: %u bytes of dynamic shared memory requested, %s allows "
                        "at most %u per block",
                        name, shared_bytes, c->info.name, c->info.max_shared_per_block_optin);
    mg_status st = MG_OK;
    pthread_mutex_lock(&k->shared_limit_lock);
    if (shared_bytes > atomic_load_explicit(&k->shared_limit_bytes, memory_order_relaxed)) {
        CUresult r = c->drv->FuncSetAttribute(
            k->function, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, (int)shared_bytes);
        if (r == CUDA_SUCCESS)
            atomic_store_explicit(&k->shared_limit_bytes, shared_bytes, memory_order_release);
        else
            st = MG_CUDA_FAIL(c, r, "cuFuncSetAttribute",
                              "MAX_DYNAMIC_SHARED_SIZE_BYTES = %u for %s (its static shared "
                              "memory counts against the %u-byte limit)",
                              shared_bytes, name, c->info.max_shared_per_block_optin);
    }
    pthread_mutex_unlock(&k->shared_limit_lock);
    return st;
}

mg_status mg_cuda_launch(void *ctx, void *kernel, const char *kernel_name, void *stream,
                         const mg_launch *l) {
    mg_cuda_context *c = ctx;
    mg_cuda_kernel *k = kernel;
    mg_status st = mg_cuda_enter(c);
    if (st)
        return st;
    if (atomic_load_explicit(&k->unloaded, memory_order_relaxed))
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "launch of %s: its module was unloaded (look the kernel up again "
                        "after reloading)",
                        kernel_name);
    if ((st = ensure_shared_limit(c, k, kernel_name, l->shared_bytes)))
        return st;

    /* One kernel parameter per argument: a pointer to its first slot. */
    void *params[MG_LAUNCH_MAX_ARGS];
    for (uint32_t i = 0; i < l->arg_count; i++)
        params[i] = (void *)mg_launch_arg_data(l, i);
    CUresult r;
    if ((l->flags & MG_LAUNCH_PROGRAMMATIC) && c->drv->LaunchKernelEx && c->info.cc_major >= 9 &&
        mg_programmatic_launch_enabled()) {
        /* The kernel waits on its grid dependency itself (metrale/launch.h): it may start
         * while the work before it drains. Captured, this becomes a programmatic edge. */
        CUlaunchAttribute attr = {.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION};
        attr.value.programmaticStreamSerializationAllowed = 1;
        CUlaunchConfig config = {.gridDimX = l->grid.x,
                                 .gridDimY = l->grid.y,
                                 .gridDimZ = l->grid.z,
                                 .blockDimX = l->block.x,
                                 .blockDimY = l->block.y,
                                 .blockDimZ = l->block.z,
                                 .sharedMemBytes = l->shared_bytes,
                                 .hStream = stream,
                                 .attrs = &attr,
                                 .numAttrs = 1};
        r = c->drv->LaunchKernelEx(&config, k->function, l->arg_count ? params : NULL, NULL);
    } else {
        r = c->drv->LaunchKernel(k->function, l->grid.x, l->grid.y, l->grid.z, l->block.x,
                                 l->block.y, l->block.z, l->shared_bytes, stream,
                                 l->arg_count ? params : NULL, NULL);
    }
    if (r != CUDA_SUCCESS) {
        /* A sticky result here comes from earlier work: the report names the kernel
         * launched before this one. */
        char desc[512];
        mg_launch_describe(l, kernel_name, desc, sizeof desc);
        return MG_CUDA_FAIL(c, r, "cuLaunchKernel", "%s", desc);
    }
    atomic_store_explicit(&c->last_kernel, k, memory_order_release);
    return MG_OK;
}
