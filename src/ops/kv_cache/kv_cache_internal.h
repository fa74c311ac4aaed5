/* kv_cache_internal.h - private to the paged KV cache ops: limits, the descriptor check and the
 * kernel names every backend ships for the append op (kernels/cuda/kv_cache/kv_append.cu and
 * kv_append_reference.c, same argument list). */
#ifndef METRALE_KV_CACHE_INTERNAL_H
#define METRALE_KV_CACHE_INTERNAL_H

#include <stdint.h>

#include "metrale/ops_kv_cache.h"

#define MG_KV_MAX_HEADS 1024u
#define MG_KV_MAX_HEAD_DIM 512u
#define MG_KV_MAX_BATCH (1u << 20)

/* Argument list (in order): k_src, v_src, q, positions, qo_indptr, kv_indptr, kv_indices,
 * kv_last_page_len, k_pages, v_pages (buffers; q and positions may be 0), then u32 batch,
 * num_tokens, num_kv_indices, num_kv_heads, num_qo_heads (0: no q), head_dim, page_size,
 * num_pages, k_stride, v_stride, q_stride, rope (0/1), f32 rope_theta, buffer rope_inv_freq
 * (FP32 [head_dim / 2], or 0). */
#define MG_KV_APPEND_KERNEL "kv_append"
/* FP8 E4M3 pools (k_pages / v_pages of bytes): the same arguments, then buffers k_scale and
 * v_scale (FP32 [num_kv_heads]). */
#define MG_KV_APPEND_FP8_KERNEL "kv_append_fp8"

mg_status mg_kv_cache_desc_check(const mg_kv_cache_desc *d, const char *fn);
/* page_size with 0 meaning the default. */
uint32_t mg_kv_page_size(uint32_t page_size);
/* Tokens request `request` holds (indptrs already checked). */
int64_t mg_kv_len(const int32_t *kv_indptr, const int32_t *last_page_len, uint32_t page_size,
                  uint32_t request);
/* Every check of mg_kv_append (status and message as it gives them), launching nothing: for a
 * fused op that appends after its own kernels (the GEMM's KV-append epilogue, src/ops/gemm/)
 * and must refuse before it launches anything. */
mg_status mg_kv_append_check(mg_backend *b, const mg_kv_cache_desc *cache,
                             const mg_kv_append_args *a);
/* Registers the CPU kernels of the append op once per process. */
void mg_kv_append_cpu_kernels_register(void);

#endif
