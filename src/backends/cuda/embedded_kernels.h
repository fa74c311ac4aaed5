/* embedded_kernels.h - private: the fatbins of kernels/cuda/ files, embedded at build time
 * (cmake/embed_cuda_kernels.cmake) and loaded by the CUDA backend as module "metrale". */
#ifndef METRALE_EMBEDDED_KERNELS_H
#define METRALE_EMBEDDED_KERNELS_H

#include <stddef.h>

typedef struct mg_embedded_kernel_image {
    const char *name; /* file stem, e.g. "vector_add" */
    const unsigned char *image;
    const size_t *bytes;
} mg_embedded_kernel_image;

/* Terminated by an entry whose name is NULL. */
extern const mg_embedded_kernel_image mg_embedded_kernel_images[];

#endif
