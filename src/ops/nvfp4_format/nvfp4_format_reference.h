/*
 * nvfp4_format_reference.h - private: the CPU reference of the NVFP4 format tools
 * (metrale/nvfp4.h) and the kernel names every backend ships for them.
 *
 * The functions below are the definition of the tools' results on host memory; the CPU backend
 * runs them as CPU kernels of module "metrale" under the CUDA kernels' names and argument lists
 * (kernels/cuda/nvfp4/nvfp4_format.cu; the lists are in metrale/nvfp4.h).
 */
#ifndef METRALE_NVFP4_FORMAT_REFERENCE_H
#define METRALE_NVFP4_FORMAT_REFERENCE_H

#include <stdbool.h>
#include <stdint.h>

#define MG_NVFP4_KERNEL_QUANTIZE "nvfp4_quantize"
#define MG_NVFP4_KERNEL_DEQUANTIZE_BF16 "nvfp4_dequantize_bf16"
#define MG_NVFP4_KERNEL_DEQUANTIZE_F32 "nvfp4_dequantize_f32"
#define MG_NVFP4_KERNEL_TRANSPOSE_NIBBLES "nvfp4_transpose_nibbles"
#define MG_NVFP4_KERNEL_TRANSPOSE_BYTES "nvfp4_transpose_bytes"
#define MG_NVFP4_KERNEL_SWIZZLE "nvfp4_scales_swizzle"
#define MG_NVFP4_KERNEL_UNSWIZZLE "nvfp4_scales_unswizzle"

/* Threads per block of every format kernel (the CUDA kernels' __launch_bounds__). */
#define MG_NVFP4_THREADS 256u

/* BF16 [n, k] (row pitch `pitch`) -> packed [n, k/2] + scales [n, k/16], by the rule of
 * metrale/nvfp4.h. */
void mg_nvfp4_quantize_reference(const uint16_t *in, float global, uint8_t *packed, uint8_t *scales,
                                 uint32_t n, uint32_t k, uint32_t pitch);

/* packed + scales + global -> FP32 (bf16_out NULL) or BF16 (f32_out NULL) [n, k]. */
void mg_nvfp4_dequantize_reference(const uint8_t *packed, const uint8_t *scales, float global,
                                   float *f32_out, uint16_t *bf16_out, uint32_t n, uint32_t k);

/* Nibble matrix [rows, cols] packed along cols (u8 [rows, cols/2], low nibble = even column)
 * -> [cols, rows] packed along rows (u8 [cols, rows/2]). rows, cols even. */
void mg_nvfp4_transpose_nibbles_reference(const uint8_t *in, uint8_t *out, uint32_t rows,
                                          uint32_t cols);

/* Byte matrix [rows, cols] -> [cols, rows]. */
void mg_nvfp4_transpose_bytes_reference(const uint8_t *in, uint8_t *out, uint32_t rows,
                                        uint32_t cols);

/* Scales [rows, cols] <-> the Blackwell layout (mg_nvfp4_swizzled_offset), padding zero. */
void mg_nvfp4_swizzle_reference(const uint8_t *in, uint8_t *out, uint32_t rows, uint32_t cols);
void mg_nvfp4_unswizzle_reference(const uint8_t *in, uint8_t *out, uint32_t rows, uint32_t cols);

/* Registers the CPU kernels once per process; later calls do nothing. */
void mg_nvfp4_format_cpu_kernels_register(void);

#endif
