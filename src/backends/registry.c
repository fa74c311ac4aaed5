/* registry.c - the backends compiled into this library, one line each (backend_impl.h). */
#include "backend_impl.h"

extern const mg_backend_driver mg_cpu_backend_driver;
#ifdef METRALE_HAVE_CUDA
extern const mg_backend_driver mg_cuda_backend_driver;
#endif
#ifdef METRALE_HAVE_METAL
extern const mg_backend_driver mg_metal_backend_driver;
#endif

static const mg_backend_driver *const drivers[] = {
    &mg_cpu_backend_driver,
#ifdef METRALE_HAVE_CUDA
    &mg_cuda_backend_driver,
#endif
#ifdef METRALE_HAVE_METAL
    &mg_metal_backend_driver,
#endif
};

const mg_backend_driver *mg_backend_driver_of(mg_backend_kind kind) {
    for (size_t i = 0; i < sizeof drivers / sizeof drivers[0]; i++)
        if (drivers[i]->kind == kind)
            return drivers[i];
    return NULL;
}
