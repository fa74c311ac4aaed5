/*
 * fp8_quantize_reference.h - private: the CPU reference of mg_fp8_quantize
 * (metrale/ops_quantize.h) and the kernel names every backend ships for it.
 *
 * The reference is the whole op on host memory, built on the quantization rule of
 * src/ops/common/fp8_quantize_host.h (the host quantizers of metrale/ops_gemm.h use the same code),
 * so it is the definition of the device quantizer's result. The CPU backend runs it as CPU
 * kernels of module "metrale" with the CUDA kernels' names and argument lists
 * (kernels/cuda/quantize/fp8_quantize.cu; the lists are in metrale/ops_quantize.h).
 */
#ifndef METRALE_FP8_QUANTIZE_REFERENCE_H
#define METRALE_FP8_QUANTIZE_REFERENCE_H

#include <stdint.h>

#include "metrale/ops_quantize.h"

#define MG_FP8_QUANTIZE_KERNEL_TENSOR_RESET "fp8_quantize_tensor_reset"
#define MG_FP8_QUANTIZE_KERNEL_TENSOR_AMAX "fp8_quantize_tensor_amax"
#define MG_FP8_QUANTIZE_KERNEL_TENSOR_CODES "fp8_quantize_tensor_codes"
#define MG_FP8_QUANTIZE_KERNEL_TENSOR_FINISH "fp8_quantize_tensor_finish"
#define MG_FP8_QUANTIZE_KERNEL_ROWS "fp8_quantize_rows"
#define MG_FP8_QUANTIZE_KERNEL_1X128 "fp8_quantize_1x128"

/* Where the 1x128 modes put row r's scale of K-block g: r * row_stride + g * block_stride,
 * for rows_out rows (rows_pad in the GEMM layout, whose padding rows are zero-filled). */
typedef struct mg_fp8_quant_1x128_layout {
    uint32_t rows_out;
    uint32_t row_stride, block_stride;
} mg_fp8_quant_1x128_layout;

/* The layout of a 1x128 mode of `d` (MG_FP8_QUANT_1X128 or _GEMM_LAYOUT). */
mg_fp8_quant_1x128_layout mg_fp8_quant_1x128_layout_of(const mg_fp8_quant_desc *d);

/* mg_fp8_quantize on host memory: `in` with row pitch d->in_pitch (0: cols), `out` and
 * `scales` sized as mg_fp8_quant_output_bytes / mg_fp8_quant_scale_count say. `d` is
 * trusted (mg_fp8_quantize checked it); nothing here fails. */
void mg_fp8_quantize_reference(const mg_fp8_quant_desc *d, const uint16_t *in, uint8_t *out,
                               float *scales);

/* Registers the CPU kernels once per process; later calls do nothing. */
void mg_fp8_quantize_cpu_kernels_register(void);

#endif
