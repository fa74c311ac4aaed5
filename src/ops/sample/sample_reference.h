/*
 * sample_reference.h - private: the CPU reference of metrale/ops_sample.h, registered as the CPU
 * kernel of module "metrale" under the CUDA kernel's name and argument list
 * (kernels/cuda/sample/sample.cu):
 *   sample_rows(buffer logits, buffer params, buffer history_or_0, buffer workspace,
 *               buffer ids, u32 rows, u32 vocab, u32 pitch, u32 logits_bf16,
 *               u32 history_pitch)
 * one block of MG_SAMPLE_THREADS threads per row on the device.
 */
#ifndef METRALE_SAMPLE_REFERENCE_H
#define METRALE_SAMPLE_REFERENCE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "metrale/ops_sample.h"

#define MG_SAMPLE_KERNEL "sample_rows"
#define MG_SAMPLE_THREADS 512u

/* FP32 values of one row's workspace: two regions of the vocabulary rounded up to 4. */
static inline uint64_t mg_sample_row_floats(uint32_t vocab) {
    return 2ull * (((uint64_t)vocab + 3) & ~3ull);
}

/* Whether one row's parameters are valid (ops_sample.h); writes the reason when not. The one
 * definition the front's mg_sample_params_check and the reference kernel share. */
bool mg_sample_params_valid(const mg_sample_params *p, uint32_t vocab, uint32_t history_pitch,
                            char *reason, size_t reason_bytes);

/* One row's id (or code) by the definition of ops_sample.h; `scratch` holds
 * mg_sample_row_floats(vocab) floats. */
int32_t mg_sample_row_reference(const void *logits, bool bf16, uint32_t vocab,
                                const mg_sample_params *p, const int32_t *history,
                                uint32_t history_pitch, float *scratch);

/* Registers the CPU kernel once per process; later calls do nothing. */
void mg_sample_cpu_kernels_register(void);

#endif
