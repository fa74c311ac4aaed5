/* registry.c - the backends compiled into this library, one line each (backend_impl.h), and
 * what follows from the list: probing a kind, the order MG_BACKEND_AUTO tries, and opening.
 * The core opens the driver it is handed (mg_core_backend_open) and names no backend. */
#include <stdio.h>
#include <string.h>

#include "backend_impl.h"
#include "error.h"

extern const mg_backend_driver mg_cpu_backend_driver;
#ifdef METRALE_HAVE_CUDA
extern const mg_backend_driver mg_cuda_backend_driver;
#endif
#ifdef METRALE_HAVE_METAL
extern const mg_backend_driver mg_metal_backend_driver;
#endif

/* The ops' CPU kernels, registered once per process (src/ops/op_registry.h). The registry
 * lists what the library is built from, so it is the one place below the ops that names them;
 * the core and the backends themselves do not. */
void mg_op_register_cpu_kernels(void);

static const mg_backend_driver *const drivers[] = {
    &mg_cpu_backend_driver,
#ifdef METRALE_HAVE_CUDA
    &mg_cuda_backend_driver,
#endif
#ifdef METRALE_HAVE_METAL
    &mg_metal_backend_driver,
#endif
};

/* MG_BACKEND_AUTO tries these in order: the first usable one that has the device. */
static const mg_backend_kind auto_order[] = {MG_BACKEND_CUDA, MG_BACKEND_METAL, MG_BACKEND_CPU};

/* The driver of `kind`, NULL when it is not compiled in. */
static const mg_backend_driver *driver_of(mg_backend_kind kind) {
    for (size_t i = 0; i < sizeof drivers / sizeof drivers[0]; i++)
        if (drivers[i]->kind == kind)
            return drivers[i];
    return NULL;
}

mg_status mg_backend_probe_kind(mg_backend_kind kind, mg_backend_probe *out) {
    if (!out || kind > MG_BACKEND_METAL)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "mg_backend_probe_kind: %s",
                        out ? "kind must be cpu, cuda or metal" : "NULL output");
    memset(out, 0, sizeof *out);
    const mg_backend_driver *d = driver_of(kind);
    if (!d) {
        snprintf(out->reason, sizeof out->reason, "%s",
                 kind == MG_BACKEND_METAL
                     ? "not compiled in (built with -DMETRALE_METAL=OFF)"
                     : "not compiled in (built without nvcc or with -DMETRALE_CUDA=OFF)");
        return MG_OK;
    }
    out->compiled_in = true;
    d->probe(out);
    out->compiled_in = true;
    return MG_OK;
}

static mg_status open_kind(mg_backend_kind kind, int device, mg_backend **out) {
    const mg_backend_driver *d = driver_of(kind);
    if (!d)
        return MG_ERROR(MG_ERR_UNAVAILABLE, "mg_backend_open: the %s backend is not compiled in",
                        mg_backend_kind_name(kind));
    mg_status st = mg_core_backend_open(d, device, out);
    /* Before the caller gets the handle: op fronts, provider checks and kernels launched by
     * name on any CPU backend then find every op's CPU kernels without registering them. */
    if (st == MG_OK && kind == MG_BACKEND_CPU)
        mg_op_register_cpu_kernels();
    return st;
}

mg_status mg_backend_open(mg_backend_kind kind, int device, mg_backend **out) {
    if (!out)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "mg_backend_open: NULL output pointer");
    *out = NULL;
    if (device < 0)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "mg_backend_open: device %d is negative", device);
    if (kind == MG_BACKEND_AUTO) {
        for (size_t i = 0; i < sizeof auto_order / sizeof auto_order[0]; i++) {
            mg_backend_probe p;
            mg_backend_probe_kind(auto_order[i], &p);
            if (p.usable && device < p.device_count)
                return open_kind(auto_order[i], device, out);
        }
        return MG_ERROR(MG_ERR_UNAVAILABLE, "mg_backend_open: no usable backend has device %d",
                        device);
    }
    if (kind > MG_BACKEND_METAL)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "mg_backend_open: unknown backend kind %d",
                        (int)kind);
    return open_kind(kind, device, out);
}
