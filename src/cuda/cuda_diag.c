/* cuda_diag.c - the driver's launch floor for benchmarks (cuda_diag.h). */
#include "cuda/cuda_diag.h"

#include "cuda_internal.h"

mg_status mg_cuda_diag_driver_launches(mg_backend *b, mg_stream *s, const char *function,
                                       const mg_launch *l, int count) {
    mg_cuda_context *c = NULL;
    CUstream stream = NULL;
    void *kernel = NULL;
    mg_status st = mg_cuda_bind(b, &c);
    if (!st)
        st = mg_cuda_stream(b, s, &stream);
    if (!st)
        st = mg_cuda_kernel_lookup(c, "metrale", function, &kernel);
    if (st)
        return st;
    CUfunction f = ((mg_cuda_kernel *)kernel)->function;
    void *params[MG_LAUNCH_MAX_ARGS];
    for (uint32_t i = 0; i < l->arg_count; i++)
        params[i] = (void *)mg_launch_arg_data(l, i);
    for (int i = 0; i < count; i++) {
        CUresult r = c->drv->LaunchKernel(f, l->grid.x, l->grid.y, l->grid.z, l->block.x,
                                          l->block.y, l->block.z, l->shared_bytes, stream,
                                          l->arg_count ? params : NULL, NULL);
        if (r != CUDA_SUCCESS)
            return MG_CUDA_FAIL(c, r, "cuLaunchKernel", "%s, launch %d of %d", function, i, count);
    }
    return MG_OK;
}
