/*
 * cuda_image.h - private: telling module images apart by content. No driver types, so tests
 * and tools can use it on machines without CUDA.
 */
#ifndef METRALE_CUDA_IMAGE_H
#define METRALE_CUDA_IMAGE_H

#include <stddef.h>

typedef enum mg_cuda_image_format {
    MG_CUDA_IMAGE_UNKNOWN = 0,
    MG_CUDA_IMAGE_PTX,    /* text with a ".version" or ".target" directive */
    MG_CUDA_IMAGE_CUBIN,  /* ELF: 0x7f 'E' 'L' 'F' */
    MG_CUDA_IMAGE_FATBIN, /* fatbin header magic 0xBA55ED50 (little-endian) */
} mg_cuda_image_format;

/* The format of `bytes` bytes at `image`; UNKNOWN for NULL, empty, or anything else
 * (binary data, text that is not PTX). PTX may end with or without its NUL. */
mg_cuda_image_format mg_cuda_image_detect(const void *image, size_t bytes);

/* "PTX", "cubin", "fatbin", "unknown". */
const char *mg_cuda_image_format_name(mg_cuda_image_format f);

#endif
